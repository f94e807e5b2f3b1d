"""Summary of scripts/audit-torch-peers.sh's peers.jsonl: per implementation the largest |O bias| and
|δ bias| over the cases, per (ties, remainder) the ranges, and how far the op with the standard shift
lies from each SDPA backend case by case (they implement the same numerics: FP32 scores and
accumulator, BF16(P̄) into P̄V, one rounding of O).

    python3 op_audit_summary.py peers.jsonl
"""
import collections
import json
import sys


def num(x):
    return 0.0 if x is None else x


rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by_impl = collections.defaultdict(dict)
for r in rows:
    by_impl[r["implementation"]][r["case"]] = r
print(f"{len(rows)} rows; implementations: {', '.join(sorted(by_impl))}")
for name, cases in sorted(by_impl.items()):
    print(f"{name:30s} cases {len(cases)}, max |O bias| {max(abs(num(r['o_bias'])) for r in cases.values()):.3f}, "
          f"max |δ bias| {max(abs(num(r['delta_bias'])) for r in cases.values()):.3f}")
op = by_impl.get("stableflash-op-standard", {})
for name in sorted(n for n in by_impl if n.startswith("sdpa-")):
    peer = by_impl[name]
    common = [c for c in op if c in peer]
    if common:
        do = max(abs(num(op[c]["o_bias"]) - num(peer[c]["o_bias"])) for c in common)
        dd = max(abs(num(op[c]["delta_bias"]) - num(peer[c]["delta_bias"])) for c in common)
        print(f"op standard vs {name}: {len(common)} cases, max |O bias difference| {do:.3f}, max |δ bias difference| {dd:.3f}")
print("ranges by (ties, remainder): O bias / δ bias")
groups = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    groups[(r["ties"], r["remainder"])][r["implementation"]].append((num(r["o_bias"]), num(r["delta_bias"])))
for key in sorted(groups):
    cells = []
    for name in sorted(groups[key]):
        v = groups[key][name]
        cells.append(f"{name} {min(o for o, _ in v):+.2f}..{max(o for o, _ in v):+.2f} / "
                     f"{min(d for _, d in v):+.2f}..{max(d for _, d in v):+.2f}")
    print(f"  {key}: " + "; ".join(cells))

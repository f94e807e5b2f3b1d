"""The δ sources at T = 128 from the audit's JSON (audit-t128.jsonl, README.md): per shift policy
and δ source, the median and largest |δ drift| and δ relative L2 error over the cases, and whether
`auto` gave the exact δ's figures in every case."""
import json
import os
import statistics
import sys

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "audit-t128.jsonl")
rows = [json.loads(line) for line in open(path)]
print("| policy | δ source | cases | |δ drift| median / largest | δ rel. L2 median / largest |")
print("|---|---|---|---|---|")
for policy in dict.fromkeys(r["policy"] for r in rows):
    for source in ("rounded", "compensated", "exact", "auto"):
        sel = [r for r in rows if r["policy"] == policy and r["delta_source"] == source]
        if not sel:
            continue
        drift = [abs(r["delta_drift"]) for r in sel]
        l2 = [r["delta_rel_l2"] for r in sel]
        print(f"| {policy} | {source} | {len(sel)} | {statistics.median(drift):.1e} / {max(drift):.1e} | "
              f"{statistics.median(l2):.1e} / {max(l2):.1e} |")
case = lambda r: (r["policy"], r["ties"], r["remainder"], r["logit_scale"])
exact = {case(r): r["delta_drift"] for r in rows if r["delta_source"] == "exact"}
auto = {case(r): r["delta_drift"] for r in rows if r["delta_source"] == "auto"}
print(f"\nauto gives the exact δ's drift in every case: {exact == auto}")

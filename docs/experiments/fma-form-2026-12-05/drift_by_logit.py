"""The compensated δ's drift under the standard shift, main against the FMA-form build, per logit
scale and per spread of the row maxima, over the full grid's `fused` cases (README.md says how the
two JSON Lines files were made), and the cases whose |drift| grew most.

    python3 drift_by_logit.py full-main.jsonl full-fma.jsonl
"""
import collections
import json
import statistics
import sys

CASE = ("ties", "remainder", "logit_scale", "spread", "T", "D", "tile", "cross_tile", "v_neg", "do_neg", "heads",
        "numerics", "policy", "normalizer", "round_bits", "delta_source")


def load(path):
    return {tuple(r[k] for k in CASE): r for r in (json.loads(line) for line in open(path) if line.strip())}


def se_median(g):
    finite = [z for _, _, z in g if z == z]  # cases whose SE is 0 give nan
    return f"{statistics.median(finite):.1f}" if finite else "no"


def main(main_path, fma_path):
    a, b = load(main_path), load(fma_path)
    assert a.keys() == b.keys(), "the two audits ran different grids"
    rows = []
    for k in a:
        c = dict(zip(CASE, k))
        if c["numerics"] != "fused" or c["policy"] != "standard" or c["delta_source"] != "compensated":
            continue
        if a[k]["delta_drift"] is None or b[k]["delta_drift"] is None:
            continue
        rows.append((c, a[k]["delta_drift"], b[k]["delta_drift"], b[k]["delta_drift_se"]))
    for key in ("logit_scale", "spread"):
        groups = collections.defaultdict(list)
        for c, x, y, se in rows:
            groups[c[key]].append((abs(x), abs(y), abs(y) / se if se else float("nan")))
        for value, g in sorted(groups.items()):
            print(f"{key} {value:g}: {len(g)} cases, median |drift| main {statistics.median(x for x, _, _ in g):.1e}, "
                  f"FMA form {statistics.median(y for _, y, _ in g):.1e} ({se_median(g)} SE)")
    rows.sort(key=lambda r: abs(r[1]) - abs(r[2]))
    print("largest growth:")
    for c, x, y, se in rows[:6]:
        print(f"  ties {c['ties']} remainder {c['remainder']:g} logit {c['logit_scale']:g} spread {c['spread']:g} T {c['T']} "
              f"D {c['D']} tile {c['tile']} cross-tile {c['cross_tile']}: {x:+.2e} -> {y:+.2e} (SE {se:.1e})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""The audit of two builds, case by case: how the `fused` rows' O bias, δ drift and tie rows moved
from the first JSON Lines file (main) to the second (the CPU oracle with FlashAttention's exp form,
oracle-fa-exp-form.patch). README.md says how both were made.

    python3 compare.py audit-main.jsonl audit-fa.jsonl
"""
import json
import sys

CASE = ("ties", "remainder", "logit_scale", "spread", "T", "D", "tile", "cross_tile", "v_neg", "do_neg", "heads",
        "numerics", "policy", "normalizer", "round_bits", "delta_source")


def load(path):
    return {tuple(r[k] for k in CASE): r for r in (json.loads(line) for line in open(path) if line.strip())}


def main(main_path, other_path):
    a, b = load(main_path), load(other_path)
    assert a.keys() == b.keys(), "the two audits ran different grids"
    paper_differ = sum(a[k] != b[k] for k in a if dict(zip(CASE, k))["numerics"] == "paper")
    fused = [k for k in a if dict(zip(CASE, k))["numerics"] == "fused"]
    ties_moved = sum(a[k]["tie_rows"] != b[k]["tie_rows"] for k in fused)
    moved = []  # O bias changes beyond twice the larger standard error + 0.02
    for k in fused:
        x, y = a[k], b[k]
        if x["o_bias"] is None or y["o_bias"] is None or dict(zip(CASE, k))["delta_source"] != "rounded":
            continue  # one row per forward: the O bias does not depend on the δ source
        if abs(x["o_bias"] - y["o_bias"]) > 2 * max(x["o_bias_se"], y["o_bias_se"]) + 0.02:
            moved.append((abs(x["o_bias"] - y["o_bias"]), dict(zip(CASE, k)), x["o_bias"], y["o_bias"]))
    moved.sort(key=lambda m: -m[0])
    print(f"paper rows that differ: {paper_differ}; fused rows: {len(fused)}; fused rows whose tie-row fraction moved: {ties_moved}")
    print(f"fused forwards whose O bias moved beyond 2 SE + 0.02: {len(moved)}, of them with remainder > 0 and "
          f"logit scale <= 60: {sum(m[1]['remainder'] > 0 and m[1]['logit_scale'] <= 60 for m in moved)}")
    for d, c, x, y in moved[:10]:
        print(f"  ties {c['ties']} remainder {c['remainder']:g} logit {c['logit_scale']:g} spread {c['spread']:g} "
              f"{c['policy']} {c['normalizer']}: {x:+.3f} -> {y:+.3f}")
    for source in ("rounded", "compensated", "exact"):
        worst = max((max(abs(a[k]["delta_drift"]), abs(b[k]["delta_drift"])) for k in fused
                     if dict(zip(CASE, k))["delta_source"] == source and dict(zip(CASE, k))["policy"] == "standard"
                     and dict(zip(CASE, k))["remainder"] > 0 and dict(zip(CASE, k))["logit_scale"] <= 60
                     and a[k]["delta_drift"] is not None and b[k]["delta_drift"] is not None), default=float("nan"))
        print(f"standard shift, {source} δ, remainder > 0, logit <= 60: largest |δ drift| of the two {worst:.1e}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

#!/usr/bin/env python3
"""The table of docs/numerics-findings.md, "Recommendation": the default attention (fused, standard
shift, compensated delta) against the previous default (hashed_offset, compensated delta) and
FlashAttention as is (standard shift, rounded delta), from `stableflash audit --json` files.

  build/stableflash audit --json > default.jsonl
  build/stableflash audit --grid full --numerics fused --policy standard,hashed_offset --normalizer fp32 --json > full.jsonl
  python3 docs/tools/default_comparison.py "default grid=default.jsonl" "full grid=full.jsonl"

Only `fused` rows with normalizer fp32 and round_bits 7 are read. Per file: the failure's case (two
ties, remainder 1e-4, logit scale 8, spread 1, one 256-key tile, D 64, ties in one tile) with the
audit's standard errors, then extremes and medians over every case of the file.
"""
import json
import statistics
import sys

VARIANTS = [("standard", "compensated", "fused + standard + compensated (default)"),
            ("hashed_offset", "compensated", "fused + hashed_offset + compensated (default until issue 11)"),
            ("standard", "rounded", "fused + standard + rounded (FlashAttention)")]
CASE = dict(ties=2, remainder=1e-4, logit_scale=8.0, spread=1.0, tile=256, D=64, cross_tile=False)
CASE_KEYS = ["ties", "remainder", "logit_scale", "spread", "T", "D", "tile", "cross_tile", "heads", "v_neg", "do_neg", "seed"]


def pm(v, se, spec):
    if v is None:
        return "null"
    return f"{v:{spec}} ± {se:.1g}" if se is not None else f"{v:{spec}}"


def rows_of(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return [r for r in rows if r["numerics"] == "fused" and r["normalizer"] == "fp32" and r["round_bits"] == 7]


def table(paths):
    print("| | " + " | ".join(v[2] for v in VARIANTS) + " |")
    print("|---|" + "---|" * len(VARIANTS))
    for arg in paths:
        name, _, path = arg.rpartition("=")  # LABEL=FILE, or FILE (labelled by its name)
        name = name or path.rsplit("/", 1)[-1]
        rows = rows_of(path)
        by = {(p, d): [r for r in rows if r["policy"] == p and r["delta_source"] == d] for p, d, _ in VARIANTS}
        n = len({tuple(r[k] for k in CASE_KEYS) for r in rows})
        case = {k: next((r for r in g if all(r[c] == v for c, v in CASE.items())), None) for k, g in by.items()}
        lines = []
        if all(case.values()):
            lines += [
                ("O bias, 2 ties, remainder 1e-4", lambda r, g: pm(case[r]["o_bias"], case[r]["o_bias_se"], "+.2f")),
                ("δ drift, same case", lambda r, g: pm(case[r]["delta_drift"], case[r]["delta_drift_se"], "+.1e")),
                ("δ relative L2 error, same case", lambda r, g: f"{case[r]['delta_rel_l2']:.1e}"),
            ]

        def med_max(field):
            def f(_, g):
                xs = [abs(r[field]) for r in g if r[field] is not None]
                return f"{statistics.median(xs):.1e} / {max(xs):.1e}"
            return f

        def ties_o(_, g):
            xs = [abs(r["o_bias"]) for r in g if r["o_bias"] is not None]
            ts = [abs(r["o_bias"]) for r in g if r["o_bias"] is not None and r["ties"] >= 2]
            return f"{max(xs):.2f} / {max(ts):.2f}"

        def z(_, g):
            zs = [abs(r["delta_drift"]) / r["delta_drift_se"] for r in g if r["delta_drift_se"]]
            return f"{statistics.median(zs):.1f} / {100 * sum(x > 2 for x in zs) / len(zs):.0f}%"

        lines += [
            ("largest \\|O bias\\|: all cases / ≥ 2 ties", ties_o),
            ("\\|δ drift\\|: median / largest", med_max("delta_drift")),
            ("\\|δ drift\\| / SE: median / cases above 2", z),
            ("δ relative L2 error: median / largest", med_max("delta_rel_l2")),
            ("non-finite outputs, collapsed rows", lambda _, g: f"{sum(r['nonfinite'] for r in g)}, {sum(r['zeroed_rows'] for r in g)}"),
        ]
        for i, (label, f) in enumerate(lines):
            head = f"{name} ({n} cases): {label}" if i == 0 else label
            print(f"| {head} | " + " | ".join(f((p, d), by[(p, d)]) for p, d, _ in VARIANTS) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    table(sys.argv[1:])

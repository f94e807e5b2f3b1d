#!/usr/bin/env python3
"""Turns `stableflash audit --json` output into the markdown tables of docs/numerics-findings.md.

  build/stableflash audit ... --json | python3 docs/tools/audit_summary.py [--vary remainder,ties]

One row per (case x numerics x policy x normalizer x round_bits); the delta columns give the
delta bias and drift (mean error / mean |delta_ref|) of each delta source.
"""
import argparse, json, sys

CASE_KEYS = ["ties", "remainder", "logit_scale", "spread", "T", "D", "tile", "cross_tile", "v_neg", "do_neg", "seed"]


def fmt(x, spec="+.2f"):
    return "null" if x is None else format(x, spec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vary", default="", help="case fields to show as columns (the others are printed once)")
    a = p.parse_args()
    rows = [json.loads(l) for l in sys.stdin if l.strip()]
    if not rows:
        sys.exit("no JSON lines on stdin")
    vary = [k for k in a.vary.split(",") if k]
    fixed = {k: rows[0][k] for k in CASE_KEYS if k not in vary and all(r[k] == rows[0][k] for r in rows)}
    print("Fixed: " + ", ".join(f"{k}={v}" for k, v in fixed.items()) + "\n")
    groups, order = {}, []
    for r in rows:
        key = tuple(r[k] for k in vary) + (r["numerics"], r["policy"], r["normalizer"], r["round_bits"])
        if key not in groups:
            groups[key] = {}
            order.append(key)
        groups[key][r["delta_source"]] = r
    sources = [s for s in ("rounded", "compensated", "exact") if any(s in g for g in groups.values())]
    head = vary + ["numerics", "policy", "norm", "bits", "O bias", "O err (ulp)"] + [f"δ {s}: bias / drift" for s in sources] + [
        "non-finite", "collapsed rows", "tie rows"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in order:
        g = groups[key]
        r = next(iter(g.values()))
        cells = [str(v) for v in key[:len(vary)]] + [r["numerics"], r["policy"], r["normalizer"], str(r["round_bits"]),
                                                      fmt(r["o_bias"]), fmt(r["mean_err_ulp"], "+.3f")]
        for s in sources:
            d = g.get(s)
            cells.append("" if d is None else f"{fmt(d['delta_bias'])} / {d['delta_drift']:+.1e}")
        cells += [str(r["nonfinite"]), str(r["zeroed_rows"]), f"{r['tie_rows']:.0%}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

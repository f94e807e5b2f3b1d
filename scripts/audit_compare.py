#!/usr/bin/env python3
"""The audit's CPU oracle against its GPU run (`stableflash audit --json` and `... --device cuda`, the
same grid): the numerics contract asks the two to draw the same conclusions. Prints each clear bias
that one side shows and the other reverses or halves, then one summary line; exit status 1 if any.

    python3 scripts/audit_compare.py audit-cpu.jsonl audit-cuda.jsonl

A bias of errors far below BF16 resolution is no conclusion, so it is counted apart: both sides'
relative L2 error under FP32's resolution of the case's logits, i.e. below 1e-4 or one FP32 step at
the logit scale, whichever is larger. (At logits 1e4, S and lse are FP32 values 2^-10 apart, so an
`exact` δ, P = exp(S - lse), has a row's scale off by up to half of that, and the audit's alike rows
round alike: a "bias" of FP32 steps, whose sign depends on the exponential's form.)
"""
import json
import math
import sys

KEYS = ("D", "T", "ties", "remainder", "logit_scale", "spread", "tile", "cross_tile", "heads", "numerics", "policy",
        "normalizer", "round_bits", "delta_source", "v_neg", "do_neg")
COUNTS = ("tie_rows", "repeated_max_rows", "fallback_rows", "zeroed_rows", "nonfinite")
SIZE = {"o_bias": "rel_l2", "delta_bias": "delta_rel_l2"}
CLEAR = 0.2  # |bias| above which a side shows a clear bias


def noise_floor(logit_scale):
    """Relative L2 error below which a bias is FP32 noise: 1e-4, or one FP32 step at |logit_scale|."""
    return max(1e-4, 2.0 ** (math.floor(math.log2(max(abs(logit_scale), 1.0))) - 23))


def load(path):
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                out[tuple(r[k] for k in KEYS)] = r
            except (ValueError, KeyError) as e:
                sys.exit(f"{path}:{n}: not an audit row ({e}; expected a JSON object with {', '.join(KEYS)})")
    return out


def val(x):
    return 0.0 if x is None else x


def differs(a, b):
    """One side shows a clear bias that the other reverses or halves."""
    return max(abs(a), abs(b)) > CLEAR and (a * b < 0 or min(abs(a), abs(b)) < 0.5 * max(abs(a), abs(b)))


def compare(cpu, gpu):
    worst = {m: 0.0 for m in SIZE}
    flips, noise, counts = [], 0, 0
    for k, c in cpu.items():
        g = gpu[k]
        for m in SIZE:
            a, b = val(c[m]), val(g[m])
            worst[m] = max(worst[m], abs(a - b))
            if not differs(a, b):
                continue
            if max(c[SIZE[m]], g[SIZE[m]]) < noise_floor(c["logit_scale"]):
                noise += 1
            else:
                flips.append((dict(zip(KEYS, k)), m, a, b, c[SIZE[m]], g[SIZE[m]]))
        counts += sum(c[f] != g[f] for f in COUNTS)
    return worst, flips, noise, counts


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: audit_compare.py CPU.jsonl CUDA.jsonl")
    cpu, gpu = load(sys.argv[1]), load(sys.argv[2])
    if not cpu:
        sys.exit(f"{sys.argv[1]}: the audit produced no rows")
    if cpu.keys() != gpu.keys():
        sys.exit(f"{sys.argv[1]} and {sys.argv[2]} cover different rows")
    worst, flips, noise, counts = compare(cpu, gpu)
    for case, m, a, b, sa, sb in flips:
        print("differs:", case, m, "cpu", round(a, 3), "cuda", round(b, 3), SIZE[m], f"{sa:.2e}/{sb:.2e}")
    print(f"audit rows: {len(cpu)}; max |o_bias cpu - cuda| = {worst['o_bias']:.3f}; max |delta_bias cpu - cuda| = "
          f"{worst['delta_bias']:.3f}; clear biases that differ: {len(flips)} (+{noise} at FP32-noise error sizes); "
          f"event-count fields that differ: {counts}")
    sys.exit(1 if flips else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Would a narrower residual keep the compensated δ unbiased? An emulation in numpy (no GPU, not
the project's audit): rows of one 256-key tile in `fused` numerics with the `standard` shift, a few
tied maxima and a small remainder mass (the audit's tie cases, docs/numerics-contract.md "The
audit's measures"), V and dO skewed to negative signs (90%), D = 64. For each way of taking O
into δ = FP32-rowsum(dO ∘ O_x) it prints the bias mean(e)/mean|e| and mean|e| of e = δ_x - δ_ref
over the rows (and mean(e), the systematic part), δ_ref from the FP64 softmax of the same FP32
scores and BF16 values.

The ways: the BF16 O (`rounded`); O plus the contract's BF16 residual r = BF16(O_fp32 - O)
(`compensated`); O plus r quantized to a signed b-bit integer code in steps of ulp(O) / 2^k
(the narrower residual docs/benchmarks.md "What is left" considered); O_fp32 itself.

    PYTHONPATH=.deps/python python3 docs/experiments/narrow-residual-2026-12-04/narrow_residual.py
"""
import numpy as np


def bf16(x):
    """Round-to-nearest-even to BF16 (values stay float32)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)


def ulp_bf16(o):
    """The BF16 step at each (BF16, normal or zero) value of o."""
    e = np.frexp(o.astype(np.float64))[1]
    return np.where(o == 0, np.ldexp(1.0, -133), np.ldexp(1.0, e - 8))


def coded(r, o, bits, k):
    """r as a signed `bits`-bit integer code in steps of ulp(o) / 2^k (clamped), back to float32."""
    step = ulp_bf16(o) / 2.0**k
    code = np.clip(np.rint(r.astype(np.float64) / step), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return (code * step).astype(np.float32)


def emulate(ties, remainder, skew=0.9, rows=4000, keys=256, dim=64, tie_score=8.0, seed=0):
    rng = np.random.default_rng(seed)
    # `ties` scores at tie_score, the others below it by d0 + U(0, 1), d0 set for the remainder mass
    u = rng.uniform(0, 1, (rows, keys - ties))
    d0 = np.log((keys - ties) * np.mean(np.exp(-u)) * (1 - remainder) / (remainder * ties))
    s = np.empty((rows, keys), np.float32)
    s[:, :ties] = tie_score
    s[:, ties:] = (tie_score - d0 - u).astype(np.float32)
    s = np.take_along_axis(s, rng.permuted(np.tile(np.arange(keys), (rows, 1)), axis=1), axis=1)
    sign = np.where(rng.uniform(size=(rows, keys, dim)) < skew, -1.0, 1.0)
    v = bf16((np.abs(rng.standard_normal((rows, keys, dim))) * sign).astype(np.float32))
    sign = np.where(rng.uniform(size=(rows, dim)) < skew, -1.0, 1.0)
    d_o = bf16((np.abs(rng.standard_normal((rows, dim))) * sign).astype(np.float32))
    # fused numerics, standard shift: P-bar FP32, its BF16 into P-bar V (FP32 sums), l of the FP32 P-bar
    pbar = np.exp((s - s.max(axis=1, keepdims=True)).astype(np.float32)).astype(np.float32)
    l = pbar.sum(axis=1, dtype=np.float32)
    o32 = (np.einsum("rn,rnd->rd", bf16(pbar), v, dtype=np.float32) / l[:, None]).astype(np.float32)
    o = bf16(o32)
    r = bf16((o32 - o).astype(np.float32))
    w = np.exp(s.astype(np.float64) - s.max(axis=1, keepdims=True))
    delta_ref = (d_o.astype(np.float64) * np.einsum("rn,rnd->rd", w / w.sum(axis=1, keepdims=True), v.astype(np.float64))).sum(axis=1)
    ways = {
        "rounded (BF16 O)": o,
        "compensated (BF16 residual, 16 bits)": o + r,
        "8-bit code, steps of ulp/128": o + coded(r, o, 8, 7),
        "5-bit code, steps of ulp/16": o + coded(r, o, 5, 4),
        "4-bit code, steps of ulp/8": o + coded(r, o, 4, 3),
        "O_fp32 (no rounding at all)": o32,
    }
    out = {}
    for name, o_x in ways.items():
        e = (d_o * o_x.astype(np.float32)).sum(axis=1, dtype=np.float32).astype(np.float64) - delta_ref
        out[name] = (np.mean(e) / np.mean(np.abs(e)), np.mean(e))
    return out


def main():
    cases = [(2, 1e-4, 0.9), (2, 1e-3, 0.9), (2, 1e-2, 0.9), (3, 1e-4, 0.9), (3, 1e-3, 0.9), (2, 1e-4, 0.5)]
    results = {c: emulate(*c) for c in cases}
    names = list(next(iter(results.values())))
    print("δ bias mean(e)/mean|e| (and mean(e)) over 4,000 rows a case; columns: ties, remainder mass, share of negative V and dO\n")
    print("| way | " + " | ".join(f"{t} ties, {r:g}, {k:g}" for t, r, k in cases) + " |")
    print("|---|" + "---|" * len(cases))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{results[c][n][0]:+.2f} ({results[c][n][1]:+.1e})" for c in cases) + " |")


if __name__ == "__main__":
    main()

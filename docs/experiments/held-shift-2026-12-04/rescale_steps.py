#!/usr/bin/env python3
"""How often a warp's O rescale runs (any of its 16 rows moved its shift) in a forward of 128-key
steps, for the shift rules of docs/benchmarks.md "What is left": `standard` (m = the running
maximum; `hashed_offset` moves at the same steps) and a held offset (the shift stays while the
tile's maximum is more than 1/4 below it, else moves to r_m + o, o in [0.5, 1) per row). Scores are
N(0, sigma^2), as the benchmark's random inputs give about sigma = 1 in score units.

    PYTHONPATH=.deps/python python3 docs/experiments/held-shift-2026-12-04/rescale_steps.py
"""
import numpy as np


def rescaled_steps(rule, keys, sigma, rng, trials=20, rows=16, step=128):
    steps = keys // step
    total = 0
    for _ in range(trials):
        tile_max = (rng.standard_normal((rows, keys)) * sigma).reshape(rows, steps, step).max(axis=2)
        offset = rng.uniform(0.5, 1.0, rows)
        m = np.full(rows, -np.inf)
        for j in range(steps):
            r = tile_max[:, j]
            if rule == "standard":
                new = np.maximum(m, r)
            else:  # held offset
                new = np.where(m - r > 0.25, m, np.maximum(m, r + offset))
            total += j > 0 and bool(np.any(new != m))
            m = new
    return total / trials, steps - 1


def main():
    rng = np.random.default_rng(0)
    print("| keys | sigma | rule | steps with a rescale (mean of 20 warps) | of |")
    print("|---|---|---|---|---|")
    for keys in (8192, 1024):
        for sigma in (1.0, 2.0):
            for rule in ("standard", "held offset"):
                mean, of = rescaled_steps(rule, keys, sigma, rng)
                print(f"| {keys} | {sigma:g} | {rule} | {mean:.1f} | {of} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Each round's ratios from the sweep's measurements (attention-sweep.jsonl: after its meta line, one line
per implementation, shape and round, in round order): ours / cuDNN forward and backward, the cure's cost
(auto against rounded δ, forward + backward time) and the exact δ's backward / cuDNN's, so that a
median's spread can be read. Usage: rounds.py attention-sweep.jsonl"""
import collections
import json
import sys

runs = collections.defaultdict(list)  # (shape, implementation) -> [(fwd_ms, bwd_ms)] in round order
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("meta"):
        continue
    shape = f"{r['B']},{r['H']},{r['T']},{r['D']} {'causal' if r['causal'] else 'full'}"
    impl = r["impl"] + ("/" + r["delta_source"] if r["impl"] == "stableflash" else "")
    runs[(shape, impl)].append((r["fwd_ms"], r["bwd_ms"]))

def cells(values):
    return " ".join(values)

print("| shape | fwd / cuDNN | bwd / cuDNN | cure's cost % | exact δ bwd / cuDNN |")
print("|---|---|---|---|---|")
for shape in sorted({s for s, _ in runs}, key=lambda s: (s.split()[0].split(",")[3], s)):
    ours, cudnn = runs[(shape, "stableflash/auto")], runs[(shape, "cudnn")]
    rounded, exact = runs[(shape, "stableflash/rounded")], runs[(shape, "stableflash/exact")]
    fwd = [f"{c[0] / o[0]:.3f}" for o, c in zip(ours, cudnn)]
    bwd = [f"{c[1] / o[1]:.3f}" for o, c in zip(ours, cudnn)]
    cure = [f"{((o[0] + o[1]) / (r[0] + r[1]) - 1) * 100:+.1f}" for o, r in zip(ours, rounded)]
    ex = [f"{c[1] / e[1]:.3f}" for e, c in zip(exact, cudnn)]
    print(f"| {shape} | {cells(fwd)} | {cells(bwd)} | {cells(cure)} | {cells(ex)} |")

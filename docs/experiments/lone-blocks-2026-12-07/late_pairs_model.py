#!/usr/bin/env python3
"""The lone-block pairs' order with tile times that vary (forty-fifth session).

makespan_model.py's tiles all take their nominal time, so any order of 1,056 tiles on 132 SMs that gives
each CTA 8 ends at 8.0 tile times: the pairs right after their heads' whole tiles (merged) predicted
8.6% less time at GPT-2 full, and 4.7% was measured. With each tile's time drawn around its nominal one
(a normal factor of spread `sigma`) the same order ends later, because a CTA that draws a whole tile
last keeps the others waiting; cheap tiles at the schedule's end even that out. The candidate
(`lone-pairs-late`): the last `late` groups of two heads take their whole tiles first and their pairs
at the end, while those heads' K/V is still in L2 (every pair at the end read 46 MB more from memory).

    python3 late_pairs_model.py

prints the mean makespan of 200 draws for head order (main before the pairs), the pairs in order and
the late pairs, at GPT-2 full (192 heads) and 8,16,1000,64 full (128 heads), a pair costing 0.87 of a
whole tile.
"""

import random
import statistics

from makespan_model import head_order, makespan

PAIR = 0.87  # between the two guesses of makespan_model.py
LATE = 16  # groups: 8 MB of L2 over two heads' K/V of 256 KB each (kL2Budget in the kernel)


def pairs_in_order(heads, whole, late=0):
    """Heads two by two, each group's whole tiles then its pair; the last `late` groups' pairs last."""
    early, tail = [], []
    groups = (heads + 1) // 2
    for g in range(groups):
        early += [1.0] * whole * min(2, heads - 2 * g)
        (tail if g >= groups - late else early).append(PAIR if 2 * g + 1 < heads else 0.75)
    return early + tail


def main():
    for heads, name in ((192, "16,12,1024,64 full (GPT-2)"), (128, "8,16,1000,64 full")):
        for sigma in (0.0, 0.03, 0.06, 0.1):
            rng = random.Random(1)
            orders = {"head order": head_order(heads, 5, 0.75), "pairs in order": pairs_in_order(heads, 5),
                      f"last {LATE} pairs last": pairs_in_order(heads, 5, LATE)}
            ends = {k: statistics.mean(makespan([c * max(0.5, rng.gauss(1, sigma)) for c in seq]) for _ in range(200))
                    for k, seq in orders.items()}
            base = ends["head order"]
            print(f"{name}, sigma {sigma}: " + ", ".join(f"{k} {v:.2f} ({v / base - 1:+.1%})" for k, v in ends.items()))


if __name__ == "__main__":
    main()

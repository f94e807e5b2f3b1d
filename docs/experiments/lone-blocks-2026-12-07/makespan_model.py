#!/usr/bin/env python3
"""The warp-specialized forward's dynamic tile schedule as list scheduling (forty-fourth session).

Each of the persistent grid's CTAs takes the schedule's next tile when it finishes its last (the kernel
draws it a pipeline's depth earlier, which this ignores). A tile costs 1 when all its consumers have
rows and `lone` when only one of them has (a head's last tile at GPT-2's 1,024 rows = 5 x 192 + 64:
one consumer of three computes; docs/benchmarks.md measured such a lone consumer at about 0.75 of a
tile's time). The makespan in tile times is what the forward's time follows.

    python3 makespan_model.py

prints the makespan of head order (main), of the partial tiles last (`partial-last.patch`) and of two
heads' lone blocks a tile after every whole tile (`lone-pairs.patch`; a pair costing `PAIR` of a whole
tile, bracketed by two guesses: a two-consumer tile measured 0.84 of a three-consumer one, and 0.9),
and checks the model against the sweep: the ratio of GPT-2 full's time to 8,16,1000,64 full's, both three-consumer
grids whose heads end in a lone tile.
"""

import heapq

SMS = 132  # H100 SXM and H200


def makespan(costs, ctas=SMS):
    """Greedy list scheduling: every tile to the CTA that is free first; the last CTA's end."""
    free = [(0.0, i) for i in range(ctas)]
    heapq.heapify(free)
    for c in costs:
        t, i = heapq.heappop(free)
        heapq.heappush(free, (t + c, i))
    return max(t for t, _ in free)


def head_order(heads, whole, last):
    """main: each head's whole tiles, then its partial last tile, head after head."""
    return [c for _ in range(heads) for c in [1.0] * whole + [last]]


def partial_last(heads, whole, last):
    """The candidate: every head's whole tiles first, then every head's partial last tile."""
    return [1.0] * (heads * whole) + [last] * heads


def lone_pairs(heads, whole, pair):
    """The pairs build: every head's whole tiles, then the lone blocks two heads a tile."""
    return [1.0] * (heads * whole) + [pair] * ((heads + 1) // 2)


PAIRS = (0.84, 0.9)


def main():
    # (name, batch x heads, whole tiles a head, the last tile's cost): 192-row tiles at D = 64
    shapes = [
        ("16,12,1024,64 full (GPT-2)", 192, 5, 0.75),
        ("8,16,1000,64 full", 128, 5, 0.75),
        ("32,16,2048,64 full (last tile: two of three blocks)", 512, 10, 0.84),
    ]
    print("| shape | head order | partial tiles last | time | lone pairs (pair 0.84, 0.9) | time |")
    print("|---|---|---|---|---|---|")
    for name, bh, whole, last in shapes:
        a, b = makespan(head_order(bh, whole, last)), makespan(partial_last(bh, whole, last))
        pairs = [makespan(lone_pairs(bh, whole, p)) for p in PAIRS] if last == 0.75 else []
        cells = (", ".join(f"{x:.2f}" for x in pairs), ", ".join(f"{x / a - 1:+.1%}" for x in pairs)) if pairs else ("-", "-")
        print(f"| {name} | {a:.2f} | {b:.2f} | {b / a - 1:+.1%} | {cells[0]} | {cells[1]} |")
    # The model against the sweep (H100, docs/experiments/attention-sweep-2026-12-07-s44, ours' forward
    # TFLOP/s): both shapes walk 8 steps of 128 keys a tile, so their times should stand as their makespans.
    gpt2, short = makespan(head_order(192, 5, 0.75)), makespan(head_order(128, 5, 0.75))
    flops_ratio = (192 * 1024**2) / (128 * 1000**2)
    measured = flops_ratio * 344 / 371  # 8,16,1000,64 full 344, GPT-2 full 371 TFLOP/s
    print(f"\nGPT-2 full / 8,16,1000,64 full in time: model {gpt2 / short:.3f}, sweep {measured:.3f}")


if __name__ == "__main__":
    main()

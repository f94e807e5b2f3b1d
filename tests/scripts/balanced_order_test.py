#!/usr/bin/env python3
"""scripts/balanced_order.py: the sequence has n² entries, each implementation n times, and each
ordered pair of neighbours (an implementation after itself included) exactly once, cyclically: the
property that gives every implementation the same mix of predecessors."""
import sys
from collections import Counter

sys.path.insert(0, sys.argv[1] + "/scripts" if len(sys.argv) > 1 else "scripts")
from balanced_order import cycles_for, pair_balanced_sequence

failures = []
for n in range(1, 10):
    seq = pair_balanced_sequence(n)
    if len(seq) != n * n or Counter(seq) != Counter({i: n for i in range(n)}):
        failures.append(f"n={n}: {seq} does not hold each of 0..{n - 1} n times")
    pairs = Counter(zip(seq, seq[1:] + seq[:1]))  # cyclic: the last precedes the first
    want = {(a, b) for a in range(n) for b in range(n)}
    if set(pairs) != want or set(pairs.values()) != {1}:
        failures.append(f"n={n}: neighbour pairs not each once: {dict(pairs)}")
    for windows in (1, n, n + 1, 13):
        c = cycles_for(windows, n)
        if c * n < windows or (c - 1) * n >= windows:
            failures.append(f"cycles_for({windows}, {n}) = {c}: not the fewest cycles giving >= {windows} windows")
try:
    pair_balanced_sequence(0)
    failures.append("pair_balanced_sequence(0) did not raise")
except ValueError:
    pass
if failures:
    print("FAIL\n  " + "\n  ".join(failures))
    sys.exit(1)
print("pair-balanced sequences: n = 1..9, every ordered pair once, cycles the fewest")

#!/usr/bin/env python3
"""scripts/balanced_order.py: the sequence has n² entries, each implementation n times, and each
ordered pair of neighbours (an implementation after itself included) exactly once, cyclically: the
property that gives every implementation the same mix of predecessors."""
import os
import sys
from collections import Counter

from script_checks import Checks, repo_root

sys.path.insert(0, os.path.join(repo_root(), "scripts"))
from balanced_order import cycles_for, pair_balanced_sequence

check = Checks()
for n in range(1, 10):
    seq = pair_balanced_sequence(n)
    check(f"n={n}: {seq} does not hold each of 0..{n - 1} n times",
          len(seq) == n * n and Counter(seq) == Counter({i: n for i in range(n)}))
    pairs = Counter(zip(seq, seq[1:] + seq[:1]))  # cyclic: the last precedes the first
    want = {(a, b) for a in range(n) for b in range(n)}
    check(f"n={n}: neighbour pairs not each once: {dict(pairs)}", set(pairs) == want and set(pairs.values()) == {1})
    for windows in (1, n, n + 1, 13):
        c = cycles_for(windows, n)
        check(f"cycles_for({windows}, {n}) = {c}: not the fewest cycles giving >= {windows} windows",
              c * n >= windows and (c - 1) * n < windows)
try:
    pair_balanced_sequence(0)
    check("pair_balanced_sequence(0) did not raise", False)
except ValueError:
    pass
check.finish("pair-balanced sequences: n = 1..9, every ordered pair once, cycles the fewest")

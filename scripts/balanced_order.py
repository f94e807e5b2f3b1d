"""The order in which scripts/attention-interleaved.py times several implementations in turn.

On a GPU at its power cap the window before sets the power state the next one starts in
(docs/benchmarks.md, "The power state of a measurement"): on the H200 a window after FlashAttention-2
(a lower-power kernel) ran up to 6% faster than the same implementation's other windows. A fixed
cyclic order hands each implementation the same predecessor every round; a Williams design gives
each every *other* one as predecessor equally often, which still favours the implementation whose
rivals draw less power than itself (it never follows itself, they do not follow it). Here every
implementation follows every implementation, itself included, exactly once per cycle: a de Bruijn
sequence of order 2 over n symbols (n² windows, each of the n² ordered pairs once, cyclically), so
every implementation's windows start from the same mix of power states.
"""
import math


def pair_balanced_sequence(n):
    """A cyclic sequence of 0..n-1, length n², in which each ordered pair (a, b), a = b included,
    occurs exactly once as neighbours (the last element precedes the first). The de Bruijn sequence
    B(n, 2) in its lexicographically least form (Fredricksen-Kessler-Maiorana: the Lyndon words of
    length 1 and 2 in order, concatenated)."""
    if n < 1:
        raise ValueError(f"pair_balanced_sequence: n >= 1 (got {n})")
    seq = []
    for a in range(n):
        seq.append(a)  # the Lyndon word (a)
        seq.extend(x for b in range(a + 1, n) for x in (a, b))  # the Lyndon words (a, b), a < b
    return seq


def cycles_for(windows, n):
    """Cycles of the sequence for at least `windows` timed windows of each of n implementations
    (each occurs n times a cycle)."""
    return math.ceil(windows / n)

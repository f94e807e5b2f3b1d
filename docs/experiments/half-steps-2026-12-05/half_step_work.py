"""How much of the warp-specialized forward's consumer steps a half step would leave out.

The plan's tiles (forward_ws_kernel.cuh: two consumers of 64 rows at D = 128, three at D = 64,
128-key steps, causal tiles starting causal_lead rows before row 0) are walked per head; a
consumer's own steps end at its last row's last key, and its last step is a half step where that
key lies in the step's first 64 keys (branch fwd-half-step). Prints, per shape, the consumer steps
of one head, how many are half steps, and the share of the steps' work they leave out (half of
each such step) -- an upper bound on the time saved.

    python3 half_step_work.py
"""


def last_key(i, q, k, causal):
    return min(k - 1, i + (k - q)) if causal else k - 1


def steps_and_halves(T, D, causal):
    consumers, block_k = (2, 128) if D == 128 else (3, 128)
    rows = 64 * consumers
    blocks = (T + rows - 1) // rows
    lead = (blocks * rows - T) // 64 * 64 if causal else 0
    steps = halves = 0
    for blk in range(blocks):
        for c in range(consumers):
            m0c = blk * rows - lead + 64 * c
            if m0c < 0 or m0c >= T:
                continue  # no rows: no steps
            last = last_key(min(m0c + 63, T - 1), T, T, causal)
            own = (last + 1 + block_k - 1) // block_k
            steps += own
            if own > 0 and last < (own - 1) * block_k + block_k // 2:
                halves += 1
    return steps, halves


if __name__ == "__main__":
    for B, H, T, D, causal in [(16, 12, 1024, 64, True), (16, 12, 1024, 64, False), (8, 16, 1000, 128, True),
                               (32, 16, 2048, 128, True), (8, 16, 4096, 128, True), (8, 16, 4097, 128, True),
                               (1, 8, 4097, 128, False), (2, 16, 16384, 128, True), (2, 16, 384, 128, True),
                               (64, 16, 512, 64, True)]:
        s, h = steps_and_halves(T, D, causal)
        print(f"{B},{H},{T},{D} {'causal' if causal else 'full':6s}  consumer steps a head {s:6d}  half steps {h:4d}"
              f"  work left out <= {50.0 * h / s:.1f}%")

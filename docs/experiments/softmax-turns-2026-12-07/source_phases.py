#!/usr/bin/env python3
"""The key loop of two forward kernels split at their barriers, from Nsight Compute source pages
(scripts/profile-attention.sh's tar.gz: profile-ours.csv, profile-cudnn.csv): per segment between
WARPGROUP.DEPBAR / BAR.SYNC / BAR.ARV instructions its instructions and warp stall samples, and for
two address ranges (the turn's critical section of each) the samples by stall reason and by opcode.

    python3 source_phases.py profile-ours.csv profile-cudnn.csv [OURS_FROM-OURS_TO CUDNN_FROM-CUDNN_TO]

Addresses are hex offsets from each kernel's first instruction, as the segments print them.
"""
import collections
import csv
import sys

LOOP_EXECUTIONS = 60000  # an instruction of the key loop runs once per warp-step (65,536 at 2,16,2048,128)


def load(path):
    """[(offset, executions, samples, SASS, {stall reason: samples})] of the source page."""
    lines = open(path).readlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    reader = csv.reader(lines[start:])
    header = next(reader)
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    rows, base = [], None
    for row in reader:
        if len(row) < len(header) - 5:
            continue
        address = int(row[col["Address"]], 16)
        base = address if base is None else base
        rows.append((address - base, int(row[col["Instructions Executed"]] or 0), int(row[col["Warp Stall Sampling (All Samples)"]] or 0),
                     row[col["Source"]].strip(), {r: int(row[col[r]] or 0) for r in reasons}))
    return rows


def loop_segments(rows, name):
    total = sum(r[2] for r in rows)
    hot = [i for i, r in enumerate(rows) if r[1] >= LOOP_EXECUTIONS]
    lo, hi = hot[0], hot[-1]
    inside = sum(r[2] for r in rows[lo:hi + 1])
    print(f"== {name}: {total} samples, {100 * inside / total:.1f}% in the key loop ({rows[lo][0]:06x}-{rows[hi][0]:06x})")
    marks = [i for i in range(lo, hi + 1) if any(b in rows[i][3] for b in ("DEPBAR", "BAR.SYNC", "BAR.ARV"))]
    prev = lo
    for m in marks + [hi + 1]:
        seg = rows[prev:m]
        if seg:
            n, s = sum(1 for r in seg if r[1] > 0), sum(r[2] for r in seg)
            print(f"  {seg[0][0]:06x}-{seg[-1][0]:06x}: {n:4d} instructions, {s:6d} samples ({100 * s / total:5.1f}%)")
        if m <= hi:
            print(f"    {rows[m][0]:06x} {rows[m][3][:50]:50s} {rows[m][2]:6d} samples ({100 * rows[m][2] / total:5.1f}%)")
        prev = m + 1


def section(rows, first, last, name):
    seg = [r for r in rows if first <= r[0] <= last]
    reasons, by_op, count = collections.Counter(), collections.Counter(), collections.Counter()
    for r in seg:
        reasons.update(r[4])
        words = r[3].split()
        op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
        by_op[op] += r[2]
        count[op] += r[1] > 0
    s = sum(reasons.values())
    print(f"== {name} {first:x}-{last:x}: {s} samples")
    print("  stall reasons:", ", ".join(f"{k[6:]} {100 * v / s:.0f}%" for k, v in reasons.most_common(8)))
    print("  samples / instructions by opcode:", ", ".join(f"{k} {v}/{count[k]}" for k, v in by_op.most_common(12)))


def main(argv):
    ours, cudnn = load(argv[0]), load(argv[1])
    loop_segments(ours, "ours")
    loop_segments(cudnn, "cudnn")
    if len(argv) >= 4:
        for rows, rng, name in ((ours, argv[2], "ours"), (cudnn, argv[3], "cudnn")):
            a, b = (int(x, 16) for x in rng.split("-"))
            section(rows, a, b, name)


if __name__ == "__main__":
    main(sys.argv[1:])

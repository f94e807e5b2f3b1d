#!/usr/bin/env python3
"""The key loop of two forward kernels split at their barriers, from Nsight Compute source pages
(scripts/profile-attention.sh's tar.gz: profile-ours.csv, profile-cudnn.csv): per segment between
WARPGROUP.DEPBAR / BAR.SYNC / BAR.ARV instructions its instructions and warp stall samples, and for
two address ranges (the turn's critical section of each) the samples by stall reason and by opcode.
The pages are read, and the key loop found, by scripts/stall_table.py's Profile.

    python3 source_phases.py profile-ours.csv profile-cudnn.csv [OURS_FROM-OURS_TO CUDNN_FROM-CUDNN_TO]

Addresses are hex offsets from each kernel's first instruction, as the segments print them.
"""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../scripts"))
from stall_table import Profile  # noqa: E402


def loop_segments(profile, name):
    base = profile.rows[0][0]
    first, last = profile.key_loop
    rows = [r for r in profile.rows if first <= r[0] <= last]
    total, inside = sum(r[4] for r in profile.rows), sum(r[4] for r in rows)  # the "All Samples" column
    print(f"== {name}: {total} samples, {100 * inside / total:.1f}% in the key loop ({first - base:06x}-{last - base:06x})")
    segment = []
    for address, _, sass, executed, samples in rows + [(None, "", "", 0, 0)]:
        if address is None or any(b in sass for b in ("DEPBAR", "BAR.SYNC", "BAR.ARV")):
            if segment:
                n, s = sum(1 for r in segment if r[3] > 0), sum(r[4] for r in segment)
                print(f"  {segment[0][0] - base:06x}-{segment[-1][0] - base:06x}: {n:4d} instructions, {s:6d} samples ({100 * s / total:5.1f}%)")
            if address is not None:
                print(f"    {address - base:06x} {sass.strip()[:50]:50s} {samples:6d} samples ({100 * samples / total:5.1f}%)")
            segment = []
        else:
            segment.append((address, None, sass, executed, samples))


def section(profile, first, last, name):
    base = profile.rows[0][0]
    rows = [r for r in profile.rows if first <= r[0] - base <= last]
    reasons, by_op, count = collections.Counter(), collections.Counter(), collections.Counter()
    for address, op, _, executed, samples in rows:
        reasons.update(profile.address_reasons.get(address, {}))
        by_op[op] += samples
        count[op] += executed > 0
    s = sum(reasons.values())
    print(f"== {name} {first:x}-{last:x}: {s} samples")
    print("  stall reasons:", ", ".join(f"{k[6:]} {100 * v / s:.0f}%" for k, v in reasons.most_common(8)))
    print("  samples / instructions by opcode:", ", ".join(f"{k} {v}/{count[k]}" for k, v in by_op.most_common(12)))


def main(argv):
    ours, cudnn = Profile(argv[0]), Profile(argv[1])
    loop_segments(ours, "ours")
    loop_segments(cudnn, "cudnn")
    if len(argv) >= 4:
        for profile, rng, name in ((ours, argv[2], "ours"), (cudnn, argv[3], "cudnn")):
            a, b = (int(x, 16) for x in rng.split("-"))
            section(profile, a, b, name)


if __name__ == "__main__":
    main(sys.argv[1:])

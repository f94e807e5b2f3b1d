#!/usr/bin/env python3
"""A rough critical path through the warp-specialized forward's step, from S landed (the step's
`WARPGROUP.DEPBAR.LE gsb0, 0x1`) over the next LINES instructions of the SASS, with assumed
latencies (cycles): 4 for FP32, FMNMX and integer arithmetic, 25 for SHFL and LDC, 20 for MUFU,
5 for F2FP. Registers and predicates carry the dependencies; the guard predicate counts as a source.
A model, not a measurement: it says which dependency chain is longest and roughly how long.

    cuobjdump -sass -fun KERNEL OBJECT | grep -v '^\\s*/\\* 0x' | sed 's@/\\*[0-9a-f]*\\*/@@; s@ *;.*@@; s/^ *//' > k.sass
    python3 critical_path.py k.sass [LINES]
"""
import re
import sys

LATENCY = {"MUFU": 20, "SHFL": 25, "LDC": 25, "LDS": 30, "F2FP": 5}
NO_DESTINATION = {"STS", "STG", "STSM", "BAR", "SYNCS", "WARPGROUP", "BRA", "HGMMA"}
REGISTER = re.compile(r"\b(U?R\d+|U?P[0-6])\b")


def critical_path(lines, window):
    start = next(i for i, line in enumerate(lines) if "DEPBAR.LE gsb0, 0x1" in line)
    ready = {}  # register -> (time, index of the instruction that wrote it)
    before = {}  # instruction index -> the instruction it waited for last
    best = (0, None)
    for i in range(start, min(start + window, len(lines))):
        text = lines[i].strip()
        guard = re.match(r"^@!?(U?P\d)\s+", text)
        body = re.sub(r"^@!?U?P\w+\s+", "", text).split(None, 1)
        if len(body) < 2:
            continue
        op = body[0].split(".")[0]
        registers = REGISTER.findall(body[1])
        if op in NO_DESTINATION:
            written, read = [], registers
        elif registers:
            written, read = registers[:1], registers[1:]
        else:
            continue
        read = read + ([guard.group(1)] if guard else [])
        t0, last = max([ready[r] for r in read if r in ready], default=(0, None))
        t = t0 + LATENCY.get(op, 4)
        before[i] = last
        for r in written:
            ready[r] = (t, i)
        best = max(best, (t, i), key=lambda x: x[0])
    chain, i = [], best[1]
    while i is not None:
        chain.append(lines[i].strip())
        i = before[i]
    return best[0], chain


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        lines = f.read().splitlines()
    cycles, chain = critical_path(lines, int(sys.argv[2]) if len(sys.argv) > 2 else 300)
    print(f"longest chain ~{cycles} cycles, {len(chain)} instructions (latest first):")
    for line in chain:
        print("  " + line)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Side-by-side instruction and stall summary of attention kernels from Nsight Compute's source page
(`ncu --import R.ncu-rep --page source --csv --print-source sass`), one CSV per kernel:

  - executed warp instructions per opcode per warp-step, a warp's 16 rows by 128 keys (--warp-steps:
    the attention's scores over 2,048; without it, the kernel's HGMMA count over --hgmma-per-step,
    16 for the forward at D = 128), so kernels of other tilings compare per unit of work;
  - warp stall samples per reason (share of all samples);
  - for the opcodes with the most samples, their stall reasons.

Written for the forward's profile against cuDNN's (docs/benchmarks.md "Kernel history", tenth
session): which instructions wait and on what. `scripts/profile-attention.sh` runs the profiles and
this script on the GPU machine.

    python3 scripts/stall_table.py ours.csv cudnn.csv [--names ours,cudnn] [--warp-steps N | --hgmma-per-step 16] [--top 12]
"""
import argparse
import collections
import csv
import re
import sys


def number(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def opcode(sass):
    """The opcode's first word without guard predicate or modifiers: '@!P0 BRA 0x10' -> 'BRA'."""
    words = re.sub(r"^@!?U?P\w+\s+", "", sass.strip()).split()
    return words[0].split(".")[0] if words else "?"


class Profile:
    def __init__(self, path):
        try:
            with open(path, newline="") as f:
                lines = [line for line in f if line.startswith('"')]  # ncu prints its own log lines first
        except OSError as e:
            sys.exit(f"{path}: {e.strerror}")
        rows = list(csv.reader(lines))
        header_at = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
        if header_at is None:
            sys.exit(f"{path}: no 'Address' header row (expected `ncu --page source --csv --print-source sass` output)")
        header = rows[header_at]
        need = ["Source", "Instructions Executed", "Warp Stall Sampling (All Samples)"]
        missing = [n for n in need if n not in header]
        if missing:
            sys.exit(f"{path}: columns {missing} missing (profile with --section SourceCounters)")
        col = {n: header.index(n) for n in need}
        # per-reason sample columns: 'stall_wait', ... (not their '(Not Issued)' twins)
        reasons = [(i, h) for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
        self.executed = collections.Counter()
        self.samples = collections.Counter()
        self.by_reason = collections.Counter()
        self.op_reasons = collections.defaultdict(collections.Counter)
        for r in rows[header_at + 1:]:
            if len(r) < len(header):
                continue
            op = opcode(r[col["Source"]])
            self.executed[op] += number(r[col["Instructions Executed"]])
            self.samples[op] += number(r[col["Warp Stall Sampling (All Samples)"]])
            for i, h in reasons:
                n = number(r[i])
                self.by_reason[h] += n
                self.op_reasons[op][h] += n
        self.total_samples = sum(self.by_reason.values())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+")
    p.add_argument("--names", help="comma-separated column names (default: the file names)")
    p.add_argument("--warp-steps", type=float, help="warp-steps of work (scores / 2048), the same for every CSV")
    p.add_argument("--hgmma-per-step", type=float, default=16.0)
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    names = a.names.split(",") if a.names else a.csv
    if len(names) != len(a.csv):
        sys.exit("--names: one name per CSV")
    profiles = [Profile(path) for path in a.csv]
    steps = []
    for name, prof in zip(names, profiles):
        if a.warp_steps:
            steps.append(a.warp_steps)
        elif prof.executed["HGMMA"] == 0:
            sys.exit(f"{name}: no HGMMA executed, cannot count steps (give --warp-steps)")
        else:
            steps.append(prof.executed["HGMMA"] / a.hgmma_per_step)

    width = max(12, *(len(n) for n in names))
    unit = f"{a.warp_steps:.0f} warp-steps of 16 rows x 128 keys" if a.warp_steps else f"HGMMA / {a.hgmma_per_step:g}"
    print(f"Warp instructions per step ({unit}), all warps of the kernel")
    print(f"{'opcode':12s}" + "".join(f" {n:>{width}s}" for n in names))
    ops = collections.Counter()
    for prof, s in zip(profiles, steps):
        for op, n in prof.executed.items():
            ops[op] += n / s
    for op, _ in ops.most_common(a.top * 2):
        print(f"{op:12s}" + "".join(f" {prof.executed[op] / s:{width}.1f}" for prof, s in zip(profiles, steps)))
    print(f"{'total':12s}" + "".join(f" {sum(prof.executed.values()) / s:{width}.0f}" for prof, s in zip(profiles, steps)))

    print("\nWarp stall samples by reason (share of all samples)")
    reasons = collections.Counter()
    for prof in profiles:
        for r, n in prof.by_reason.items():
            reasons[r] += n / max(prof.total_samples, 1)
    for r, _ in reasons.most_common(a.top):
        print(f"{r:24s}" + "".join(f" {prof.by_reason[r] / max(prof.total_samples, 1):{width}.1%}" for prof in profiles))

    for name, prof in zip(names, profiles):
        print(f"\n{name}: the opcodes with the most samples and their three largest reasons")
        for op, n in prof.samples.most_common(a.top):
            top3 = ", ".join(f"{r[6:]} {c / max(n, 1):.0%}" for r, c in prof.op_reasons[op].most_common(3))
            print(f"  {op:12s} {n / max(prof.total_samples, 1):6.1%}  ({top3})")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Side-by-side instruction and stall summary of attention kernels from Nsight Compute's source page
(`ncu --import R.ncu-rep --page source --csv --print-source sass`), one CSV per kernel:

  - executed warp instructions per opcode per warp-step, a warp's 16 rows by 128 keys (--warp-steps:
    the attention's scores over 2,048; without it, the kernel's HGMMA count over --hgmma-per-step,
    16 for the forward at D = 128), so kernels of other tilings compare per unit of work;
  - warp stall samples per reason (share of all samples);
  - for the opcodes with the most samples, their stall reasons;
  - the key loop (the shortest loop, closed by a backward branch, that runs 3/4 of the HGMMA) against
    the rest of the kernel: its share of the stall samples, its warp instructions per iteration,
    and the instructions outside it per iteration (set-up, epilogue, producer: the per-tile costs);
  - outside the key loop, the instructions with the most samples (offset from the kernel's first
    instruction, SASS, share of all samples, reasons), a branch shown with the instruction before
    it: a retry branch after `SYNCS.PHASECHK` is a wait on that mbarrier (Q, K/V), after `BAR` a
    named barrier: where the per-tile time goes.

Written for the forward's profile against cuDNN's (docs/benchmarks.md "Kernel history", tenth
session): which instructions wait and on what. `scripts/profile-attention.sh` runs the profiles and
this script on the GPU machine.

    python3 scripts/stall_table.py ours.csv cudnn.csv [--names ours,cudnn] [--warp-steps N | --hgmma-per-step 16] [--top 12]
"""
import argparse
import collections
import csv
import functools
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
        col_address = header.index("Address") if "Address" in header else None
        self.rows = []  # (address, opcode, SASS, executed, samples) in address order, where addresses are given
        self.executed = collections.Counter()
        self.samples = collections.Counter()
        self.by_reason = collections.Counter()
        self.op_reasons = collections.defaultdict(collections.Counter)
        self.address_reasons = {}  # address -> Counter of reasons, where addresses are given
        for r in rows[header_at + 1:]:
            if len(r) < len(header):
                continue
            op = opcode(r[col["Source"]])
            executed, samples = number(r[col["Instructions Executed"]]), number(r[col["Warp Stall Sampling (All Samples)"]])
            self.executed[op] += executed
            self.samples[op] += samples
            address = None
            if col_address is not None:
                try:
                    address = int(r[col_address], 16)
                    self.rows.append((address, op, r[col["Source"]], executed, samples))
                except ValueError:
                    pass
            for i, h in reasons:
                n = number(r[i])
                self.by_reason[h] += n
                self.op_reasons[op][h] += n
                if address is not None and n:
                    self.address_reasons.setdefault(address, collections.Counter())[h] += n
        self.total_samples = sum(self.by_reason.values())
        self.rows.sort()

    @functools.cached_property
    def key_loop(self):
        """(first, last) address of the key loop, or None: the shortest loop (a backward branch's
        target to the branch) whose body executes at least 3/4 of the kernel's HGMMA, so the step
        loop rather than the tile loop around it, nor a span closed by an out-of-line retry path.
        Searched once per profile (both the loop split and the hotspots outside it read it)."""
        all_hgmma = sum(e for _, o, _, e, _ in self.rows if o == "HGMMA")
        best = None
        for address, op, sass, _, _ in self.rows:
            m = re.search(r"\bBRA(?:\.\S+)*\s+(0x[0-9a-fA-F]+)", sass)
            if op != "BRA" or not m or int(m.group(1), 16) >= address:
                continue
            first = int(m.group(1), 16)
            hgmma = sum(e for a, o, _, e, _ in self.rows if first <= a <= address and o == "HGMMA")
            if all_hgmma and 4 * hgmma >= 3 * all_hgmma and (best is None or address - first < best[1] - best[0]):
                best = (first, address)
        return best

    def outside_loop_hotspots(self, top):
        """The `top` instructions outside the key loop with the most samples, as (offset, SASS,
        samples, reasons, previous SASS); [] without a loop or without addresses."""
        loop = self.key_loop
        if loop is None or not self.rows:
            return []
        first, last = loop
        base = self.rows[0][0]
        previous = {self.rows[i][0]: self.rows[i - 1][2] for i in range(1, len(self.rows))}
        outside = [row for row in self.rows if not first <= row[0] <= last and row[4] > 0]
        outside.sort(key=lambda row: -row[4])
        return [(a - base, sass, n, self.address_reasons.get(a, collections.Counter()), previous.get(a, ""))
                for a, _, sass, _, n in outside[:top]]

    def loop_split(self):
        """Samples and executed instructions inside the key loop and outside it, and its iterations
        (the executions of its first instruction), or None without a loop."""
        loop = self.key_loop
        if loop is None:
            return None
        first, last = loop
        inside = [row for row in self.rows if first <= row[0] <= last]
        iterations = next((e for a, _, _, e, _ in inside if a == first), 0)
        return {
            "samples_in": sum(row[4] for row in inside),
            "samples_all": sum(row[4] for row in self.rows),
            "executed_in": sum(row[3] for row in inside),
            "executed_all": sum(row[3] for row in self.rows),
            "iterations": iterations,
        }


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

    splits = [prof.loop_split() for prof in profiles]
    if any(splits):
        print("\nThe key loop (the shortest loop that runs 3/4 of the HGMMA) and the rest of the kernel")
        print(f"{'':34s}" + "".join(f" {n:>{width}s}" for n in names))

        def row(label, value):
            print(f"{label:34s}" + "".join(f" {value(sp):>{width}s}" if sp else f" {'-':>{width}s}" for sp in splits))

        row("stall samples in the loop", lambda sp: f"{sp['samples_in'] / max(sp['samples_all'], 1):.1%}")
        row("warp instructions per iteration", lambda sp: f"{sp['executed_in'] / max(sp['iterations'], 1):.0f}")
        row("outside it, per iteration", lambda sp: f"{(sp['executed_all'] - sp['executed_in']) / max(sp['iterations'], 1):.0f}")
        row("iterations (warp-level)", lambda sp: f"{sp['iterations']}")

    for name, prof in zip(names, profiles):
        hot = prof.outside_loop_hotspots(a.top)
        if not hot:
            continue
        print(f"\n{name}: outside the key loop, the instructions with the most samples")
        for offset, sass, n, why, before in hot:
            top3 = ", ".join(f"{r[6:]} {c / max(n, 1):.0%}" for r, c in why.most_common(3))
            after = f"   after: {' '.join(before.split())[:48]}" if opcode(sass) == "BRA" else ""
            print(f"  +{offset:#07x} {' '.join(sass.split())[:44]:44s} {n / max(prof.total_samples, 1):6.1%}  ({top3}){after}")

    for name, prof in zip(names, profiles):
        print(f"\n{name}: the opcodes with the most samples and their three largest reasons")
        for op, n in prof.samples.most_common(a.top):
            top3 = ", ".join(f"{r[6:]} {c / max(n, 1):.0%}" for r, c in prof.op_reasons[op].most_common(3))
            print(f"  {op:12s} {n / max(prof.total_samples, 1):6.1%}  ({top3})")


if __name__ == "__main__":
    main()

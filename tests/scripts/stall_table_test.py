#!/usr/bin/env python3
"""scripts/stall_table.py on a small source page in Nsight Compute's CSV form (a log line, the kernel
row, the header, instruction rows): its per-step counts and stall shares must be the ones the rows
imply, computed here from the same rows; malformed input must end with a message naming the file.

    python3 tests/scripts/stall_table_test.py REPO
"""
import os
import re
import subprocess
import sys
import tempfile

from script_checks import Checks, repo_root

repo = repo_root()
script = os.path.join(repo, "scripts", "stall_table.py")
check = Checks()


# (SASS, executed, samples per reason)
rows = [
    ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR24], RZ, !UPT", 64, {"stall_wait": 6, "stall_selected": 2}),
    ("@P0 FMUL R1, R2, UR16", 300, {"stall_selected": 9, "stall_dispatch": 3}),
    ("MUFU.EX2 R3, R3", 260, {"stall_wait": 20, "stall_selected": 4}),
    ("@!P1 BRA 0x7f00", 12, {"stall_long_sb": 5}),
]
reasons = ["stall_barrier", "stall_dispatch", "stall_long_sb", "stall_selected", "stall_wait"]
header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "# Samples", "Instructions Executed"] + reasons + [r + " (Not Issued)" for r in reasons]


def line(cells):
    return ",".join('"' + str(c) + '"' for c in cells) + "\n"


with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "k.csv")
    with open(path, "w") as f:
        f.write("==PROF== Connected to process\n")  # ncu's log lines come first
        f.write(line(["Kernel Name", "k"]))
        f.write(line(header))
        for i, (sass, executed, by) in enumerate(rows):
            total = sum(by.values())
            f.write(line([hex(16 * i), sass, total, total, total, executed] + [by.get(r, 0) for r in reasons] +
                         [0] * len(reasons)))
    out = subprocess.run([sys.executable, script, path, "--names", "k", "--hgmma-per-step", "16"],
                         capture_output=True, text=True)
    check("runs (exit 0)", out.returncode == 0)
    text = out.stdout
    steps = 64 / 16
    for op, executed in (("FMUL", 300), ("MUFU", 260), ("HGMMA", 64), ("BRA", 12)):
        m = re.search(rf"^{op}\s+([0-9.]+)$", text, re.M)
        check(f"{op} per step = {executed / steps:.1f}", m is not None and abs(float(m.group(1)) - executed / steps) < 0.05)
    all_samples = sum(sum(by.values()) for _, _, by in rows)
    wait = sum(by.get("stall_wait", 0) for _, _, by in rows)
    m = re.search(r"^stall_wait\s+([0-9.]+)%$", text, re.M)
    check(f"stall_wait share = {100 * wait / all_samples:.1f}%", m is not None and abs(float(m.group(1)) - 100 * wait / all_samples) < 0.05)
    # the guard predicate is not the opcode: '@P0 FMUL' counts as FMUL
    check("no opcode named after a predicate", re.search(r"^@", text, re.M) is None)
    m = re.search(r"^\s+MUFU\s+([0-9.]+)%\s+\(wait ([0-9]+)%", text, re.M)
    check("MUFU's largest reason is wait, 20 of 24 samples", m is not None and m.group(2) == str(round(100 * 20 / 24)))
    # --warp-steps overrides the HGMMA count
    out = subprocess.run([sys.executable, script, path, "--warp-steps", "10"], capture_output=True, text=True)
    m = re.search(r"^FMUL\s+([0-9.]+)$", out.stdout, re.M)
    check("--warp-steps 10: FMUL 30.0", m is not None and abs(float(m.group(1)) - 30.0) < 0.05)

    # The key loop: the shortest backward-branch span that runs 3/4 of the HGMMA. Here the step loop
    # 0x10-0x30, not the retry path's span 0x10-0x50 nor the tile loop 0x0-0x60 around both.
    loop_rows = [  # (address, SASS, executed, samples)
        (0x00, "S2R R0, SR_TID.X", 4, 1),
        (0x10, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR24], RZ, !UPT", 40, 10),
        (0x20, "FMUL R1, R2, R3", 40, 20),
        (0x30, "@P0 BRA 0x10", 40, 5),
        (0x40, "STS [R4], R1", 8, 30),
        (0x50, "BRA 0x10", 2, 0),
        (0x60, "@P1 BRA 0x0", 4, 4),
    ]
    looped = os.path.join(d, "loop.csv")
    with open(looped, "w") as f:
        f.write(line(header))
        for address, sass, executed, samples in loop_rows:
            f.write(line([hex(address), sass, samples, samples, samples, executed] +
                         [samples if r == "stall_wait" else 0 for r in reasons] + [0] * len(reasons)))
    out = subprocess.run([sys.executable, script, looped, "--names", "k"], capture_output=True, text=True)
    check("a kernel with loops: runs (exit 0)", out.returncode == 0)
    in_loop = [r for r in loop_rows if 0x10 <= r[0] <= 0x30]
    iterations = 40
    want = {
        "stall samples in the loop": f"{sum(r[3] for r in in_loop) / sum(r[3] for r in loop_rows):.1%}",
        "warp instructions per iteration": f"{sum(r[2] for r in in_loop) / iterations:.0f}",
        "outside it, per iteration": f"{(sum(r[2] for r in loop_rows) - sum(r[2] for r in in_loop)) / iterations:.0f}",
        "iterations (warp-level)": str(iterations),
    }
    for label, value in want.items():
        m = re.search(rf"^{re.escape(label)}\s+(\S+)$", out.stdout, re.M)
        check(f"{label} = {value}", m is not None and m.group(1) == value)
    # outside the loop: its instructions with samples, most first, offsets from the first instruction,
    # a branch with the instruction before it (the wait it retries)
    outside = sorted((r for r in loop_rows if not 0x10 <= r[0] <= 0x30 and r[3] > 0), key=lambda r: -r[3])
    hot = re.findall(r"^\s+\+(0x[0-9a-f]+) (.+?)\s+([0-9.]+)%  \((.*?)\)(?:\s+after: (.*))?$", out.stdout, re.M)
    check(f"outside the loop: {len(outside)} instructions listed", len(hot) == len(outside))
    check("most samples first: STS at +0x40", len(hot) > 0 and int(hot[0][0], 16) == 0x40 and hot[0][1].startswith("STS"))
    total = sum(r[3] for r in loop_rows)
    check(f"STS's share = {100 * 30 / total:.1f}%", len(hot) > 0 and abs(float(hot[0][2]) - 100 * 30 / total) < 0.05)
    bra = [h for h in hot if h[1].startswith("@P1 BRA")]
    check("the branch names the instruction before it", len(bra) == 1 and bra[0][4].startswith("BRA 0x10"))
    # without a backward branch around HGMMA there is no key loop and no key-loop section
    m = re.search(r"^stall samples in the loop\s+(\S+)$", text, re.M)
    check("no loop in the first page: no key-loop section", m is None)

    bad = os.path.join(d, "bad.csv")
    with open(bad, "w") as f:
        f.write(line(["not", "a", "source", "page"]))
    out = subprocess.run([sys.executable, script, bad], capture_output=True, text=True)
    check("a CSV without the header fails naming the file", out.returncode != 0 and "bad.csv" in out.stderr)
    out = subprocess.run([sys.executable, script, os.path.join(d, "missing.csv")], capture_output=True, text=True)
    check("a missing file fails naming it", out.returncode != 0 and "missing.csv" in out.stderr)

check.finish("stall_table: all checks passed")

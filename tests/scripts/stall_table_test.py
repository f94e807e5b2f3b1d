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

repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
script = os.path.join(repo, "scripts", "stall_table.py")
failures = []


def check(what, ok):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


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

    bad = os.path.join(d, "bad.csv")
    with open(bad, "w") as f:
        f.write(line(["not", "a", "source", "page"]))
    out = subprocess.run([sys.executable, script, bad], capture_output=True, text=True)
    check("a CSV without the header fails naming the file", out.returncode != 0 and "bad.csv" in out.stderr)
    out = subprocess.run([sys.executable, script, os.path.join(d, "missing.csv")], capture_output=True, text=True)
    check("a missing file fails naming it", out.returncode != 0 and "missing.csv" in out.stderr)

print(f"{len(failures)} failures" if failures else "stall_table: all checks passed")
sys.exit(1 if failures else 0)

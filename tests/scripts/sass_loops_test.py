#!/usr/bin/env python3
"""scripts/sass_loops.py on a small listing in nvdisasm -c's form: two functions, one with a loop
nested in another and a forward branch that is not a loop; the counts of each loop, an inner loop before the one around it,
the uniform opcodes apart, the function filter, and a listing without such a loop refused."""
import contextlib
import io
import os
import subprocess
import sys
import tempfile

from script_checks import Checks, repo_root

sys.path.insert(0, os.path.join(repo_root(), "scripts"))
import sass_loops  # noqa: E402

LISTING = """\t.text
.text._Z6kernelv:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   UIADD3 UR4, UR4, 0x1, URZ ;
.L_x_2:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0030*/                   MUFU.EX2 R3, R2 ;
        /*0040*/                   FMUL.FTZ R4, R3, 0.5 ;
        /*0050*/              @!P0 BRA `(.L_x_2) ;
        /*0060*/                   FADD R5, R4, R4 ;
        /*0070*/               @P1 BRA `(.L_x_3) ;
        /*0080*/                   FFMA R6, R5, R5, R4 ;
.L_x_3:
        /*0090*/                   BRA `(.L_x_1) ;
        /*00a0*/                   EXIT ;
.text._Z5otherv:
        /*0000*/                   FMUL R1, R1, R1 ;
.L_x_9:
        /*0010*/                   FADD R1, R1, R1 ;
        /*0020*/                   BRA `(.L_x_9) ;
"""

check = Checks()
fns = sass_loops.functions(LISTING.splitlines())
check(f"two functions read: {list(fns)}", list(fns) == ["_Z6kernelv", "_Z5otherv"])
rows = sass_loops.table(fns, "kernel", ["HGMMA", "MUFU", "FMUL", "FADD", "FFMA"], False)
# the inner loop: HGMMA, MUFU, FMUL, BRA (4); the outer one from UIADD3 to the last BRA (9, the forward
# branch and the FFMA it skips included)
check(f"two loops, the inner one first: {rows}", [(r[3]) for r in rows] == [4, 9])
if len(rows) == 2:
    check(f"inner loop counts: {rows[0]}", rows[0][4] == [1, 1, 1, 0, 0] and rows[0][5] == 0)
    check(f"outer loop counts: {rows[1]}", rows[1][4] == [1, 1, 1, 1, 1] and rows[1][5] == 1)
check("the other function's loop has no HGMMA, so it is left out", sass_loops.table(fns, "other", ["FADD"], False) == [])
check("--all lists it", [r[3] for r in sass_loops.table(fns, "other", ["FADD"], True)] == [2])

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "k.sass")
    with open(path, "w") as f:
        f.write(LISTING)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sass_loops.main([path, "kernel"])
    check(f"the table has a header and two rows: {out.getvalue()!r}", len(out.getvalue().strip().splitlines()) == 4)
    r = subprocess.run([sys.executable, os.path.join(repo_root(), "scripts", "sass_loops.py"), path, "other"], capture_output=True, text=True)
    check(f"no loop with a product: refused with a message, rc {r.returncode}, {r.stderr!r}", r.returncode != 0 and "no loop" in r.stderr)
check.finish("sass_loops: loops by back edge, inner before outer, counted by opcode")

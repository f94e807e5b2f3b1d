#!/usr/bin/env python3
"""scripts/device-libs.sh's require_dependency_records, which the packs call: on a small ninja tree whose
objects all have their dependency records it passes; once an object's record is empty (what an
interrupted or concurrent ninja run leaves) it fails and names that object and no other."""
import os
import shutil
import subprocess
import tempfile

from script_checks import Checks, repo_root

BUILD_NINJA = """rule cc
  command = cc -MD -MF $out.d -c $in -o $out
  depfile = $out.d
  deps = gcc
rule cc_no_record
  command = cc -c $in -o $out && printf '%s:\\n' $out > $out.d
  depfile = $out.d
  deps = gcc
build with_record.c.o: cc with_record.c
build no_record.c.o: {second_rule} no_record.c
"""


def ninja_tree(root, second_rule):
    with open(os.path.join(root, "header.h"), "w") as f:
        f.write("#define ANSWER 42\n")
    for name in ("with_record.c", "no_record.c"):
        with open(os.path.join(root, name), "w") as f:
            f.write('#include "header.h"\nint %s(void) { return ANSWER; }\n' % name.split(".")[0])
    with open(os.path.join(root, "build.ninja"), "w") as f:
        f.write(BUILD_NINJA.format(second_rule=second_rule))
    subprocess.run(["ninja", "-C", root], check=True, capture_output=True)


def require_records(repo, build):
    script = f'. "{repo}/scripts/device-libs.sh" && require_dependency_records "{build}"'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


check = Checks()
repo = os.path.abspath(repo_root())
if shutil.which("ninja") is None or shutil.which("cc") is None:
    check("ninja and cc are on PATH (scripts/setup-deps.sh installs them)", False)
else:
    with tempfile.TemporaryDirectory() as good, tempfile.TemporaryDirectory() as bad:
        ninja_tree(good, "cc")
        r = require_records(repo, good)
        check(f"a tree whose objects all have records was refused: rc {r.returncode}, {r.stderr!r}", r.returncode == 0)
        ninja_tree(bad, "cc_no_record")
        r = require_records(repo, bad)
        check(f"a tree with an object without a record passed: {r.stderr!r}", r.returncode != 0)
        check(f"the refusal does not name no_record.c.o: {r.stderr!r}", "no_record.c.o" in r.stderr)
        check(f"the refusal names with_record.c.o, which has its record: {r.stderr!r}", "with_record.c.o" not in r.stderr)
check.finish("require_dependency_records: a complete tree passes, an object without a record is named")

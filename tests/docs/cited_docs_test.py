#!/usr/bin/env python3
"""Every document the code cites exists in the repository (issue 12: the numerics contract and
the architecture were cited by the design notes' names, which the repository did not have). A citation is a name ending in .md in a source file (C++, CUDA, Python, shell, CMake); it
must name a file from the repository root (docs/numerics-contract.md) or, bare, one in docs/.
Names built from variables ($OUT/table.md) are not citations.

    python3 tests/docs/cited_docs_test.py [REPO_ROOT]
"""
import os
import re
import sys

CODE = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".py", ".sh", ".cmake", ".in")
SKIP_DIRS = {".git", ".deps", ".peers", ".pyenv-local", "runs", "__pycache__"}
# not preceded by a word character, $, /, { or }, so that $OUT/table.md and URLs are not read
CITATION = re.compile(r"(?<![\w$/{}.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
    missing, seen = [], 0
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith("build")]
        for f in files:
            if not (f.endswith(CODE) or f == "CMakeLists.txt"):
                continue
            path = os.path.join(d, f)
            for n, line in enumerate(open(path, errors="replace"), 1):
                for m in CITATION.finditer(line):
                    name = m.group(1)
                    seen += 1
                    candidates = [os.path.join(root, name)] + ([os.path.join(root, "docs", name)] if "/" not in name else [])
                    if not any(os.path.isfile(c) for c in candidates):
                        missing.append(f"{os.path.relpath(path, root)}:{n}: cites {name}, which the repository lacks")
    for m in missing:
        print(m)
    print(f"{seen - len(missing)} passed, {len(missing)} failed (citations of .md files in the code)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

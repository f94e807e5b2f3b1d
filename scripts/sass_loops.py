#!/usr/bin/env python3
"""The loops of a kernel's SASS and what one pass through each issues, by opcode: the static count
behind a prediction of the kind docs/benchmarks.md makes ("the step loop 1,265 -> 1,230 instructions"),
here on the machine without a GPU.

    scripts/sass-count.sh OBJECT FUNCTION_REGEX [NVCC_FLAG ...]   # compiles, disassembles, runs this
or by hand:
    nvcc -arch=sm_90a -cubin ... file.cu -o k.cubin        # one kernel object's device code
    nvdisasm -c k.cubin > k.sass                            # PyPI nvidia-cuda-nvdisasm has nvdisasm
    scripts/sass_loops.py k.sass delta_exact_kernel [--all] [--ops MUFU,FFMA,FMUL,FADD,HGMMA]

A loop is the span from a label to a branch back to it (a back edge), listed in the order of the back
edges: an inner loop before the loops around it. Only loops with a tensor-core product (HGMMA) are
listed unless --all. A loop's count is its static instructions, every branch of it included: where a
loop holds code for several run-time cases, compile with the cases fixed (the experiments' READMEs say
how) to count the path one case runs.
"""
import argparse
import collections
import re
import sys

FUNCTION = re.compile(r"^\.text\.(\S+):")
LABEL = re.compile(r"^(\.L_x_\d+):")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
TARGET = re.compile(r"(\.L_x_\d+)")


def functions(lines):
    """{name: [("label", name) | ("ins", opcode, operands)]} in listing order."""
    out, current = collections.OrderedDict(), None
    for line in lines:
        m = FUNCTION.match(line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        if current is None:
            continue
        m = LABEL.match(line)
        if m:
            current.append(("label", m.group(1)))
            continue
        m = INSTRUCTION.match(line)
        if m:
            current.append(("ins", m.group(1), m.group(2)))
    return out


def loops(body):
    """The instructions and the (first, last) index pairs of each back edge's loop, in the order of
    their back edges: an inner loop before the loops around it."""
    at, ins = {}, []
    for entry in body:
        if entry[0] == "label":
            at[entry[1]] = len(ins)
        else:
            ins.append(entry)
    spans = []
    for i, (_, opcode, operands) in enumerate(ins):
        m = TARGET.search(operands)
        if opcode.startswith("BRA") and m and m.group(1) in at and at[m.group(1)] <= i:
            spans.append((at[m.group(1)], i))
    return ins, spans


def opcode_class(opcode):
    """FMUL.FTZ -> FMUL; uniform-datapath opcodes (U...) stay apart under their own names."""
    return opcode.split(".")[0]


def table(functions_, pattern, ops, every_loop):
    rows = []
    for name, body in functions_.items():
        if not re.search(pattern, name):
            continue
        ins, spans = loops(body)
        for first, last in spans:
            counts = collections.Counter(opcode_class(e[1]) for e in ins[first:last + 1])
            if not every_loop and counts["HGMMA"] == 0:
                continue
            uniform = sum(v for k, v in counts.items() if k.startswith("U"))
            rows.append((name, first, last, last - first + 1, [counts[o] for o in ops], uniform))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", help="nvdisasm -c output")
    ap.add_argument("function", help="a regular expression the (mangled) function name must match")
    ap.add_argument("--all", action="store_true", help="loops without a tensor-core product too")
    ap.add_argument("--ops", default="HGMMA,MUFU,FFMA,FMUL,FADD", help="opcodes to count apart")
    a = ap.parse_args(argv)
    ops = a.ops.split(",")
    with open(a.sass) as f:
        rows = table(functions(f), a.function, ops, a.all)
    if not rows:
        sys.exit(f"no loop in a function matching {a.function!r}" + ("" if a.all else " with an HGMMA (--all for any)"))
    print("| function | loop (instructions) | length | " + " | ".join(ops) + " | uniform |")
    print("|---|---|---|" + "---|" * (len(ops) + 1))
    for name, first, last, length, counts, uniform in rows:
        print(f"| {name[-60:]} | {first}-{last} | {length} | " + " | ".join(map(str, counts)) + f" | {uniform} |")


if __name__ == "__main__":
    main()

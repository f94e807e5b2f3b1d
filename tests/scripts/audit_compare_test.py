#!/usr/bin/env python3
"""scripts/audit_compare.py on synthetic audit rows: a clear bias that the GPU reverses or halves is
reported (exit 1) unless both sides' errors sit under FP32's resolution of the case's logits (one FP32
step at the logit scale, computed here from the float32 encoding, or 1e-4); agreeing rows, event
counts and malformed input as documented.

    python3 tests/scripts/audit_compare_test.py REPO
"""
import copy
import json
import os
import struct
import subprocess
import sys
import tempfile

from script_checks import Checks, repo_root

repo = repo_root()
script = os.path.join(repo, "scripts", "audit_compare.py")
check = Checks()


def fp32_step(x):
    """The gap between float32(x) and the next float32 up, from the encoding (x a power of two or not)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    lo = struct.unpack("<f", struct.pack("<I", bits))[0]
    return struct.unpack("<f", struct.pack("<I", bits + 1))[0] - lo


def row(logit_scale, o_bias=0.1, delta_bias=0.1, rel_l2=2e-3, delta_rel_l2=2e-3, ties=2, nonfinite=0):
    return {"D": 128, "T": 256, "ties": ties, "remainder": 1e-4, "logit_scale": logit_scale, "spread": 1.0, "tile": 64,
            "cross_tile": False, "heads": 2, "numerics": "fused", "policy": "standard", "normalizer": "fp32",
            "round_bits": 7, "delta_source": "exact", "v_neg": 0.9, "do_neg": 0.9, "o_bias": o_bias,
            "delta_bias": delta_bias, "rel_l2": rel_l2, "delta_rel_l2": delta_rel_l2, "tie_rows": 0.5,
            "repeated_max_rows": 0.5, "fallback_rows": 0.0, "zeroed_rows": 0, "nonfinite": nonfinite}


def run(cpu_rows, gpu_rows):
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name, rows in (("cpu", cpu_rows), ("gpu", gpu_rows)):
            p = os.path.join(d, name + ".jsonl")
            with open(p, "w") as f:
                for r in rows:
                    f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
            paths.append(p)
        res = subprocess.run([sys.executable, script] + paths, capture_output=True, text=True)
        return res.returncode, res.stdout + res.stderr


# 1. identical audits: nothing differs
base = [row(8.0), row(60.0), row(1e4)]
rc, out = run(base, base)
check(f"identical rows pass (rc {rc}): {out}", rc == 0 and "clear biases that differ: 0 (+0" in out)

# 2. a clear O bias reversed at BF16-sized errors is reported
gpu = copy.deepcopy(base)
gpu[0]["o_bias"], base_flip = -0.5, copy.deepcopy(base)
base_flip[0]["o_bias"] = 0.5
rc, out = run(base_flip, gpu)
check(f"a reversed O bias fails (rc {rc}): {out}", rc == 1 and "differs:" in out and "clear biases that differ: 1 " in out)

# 3. an exact δ's bias halved at logits 1e4 with errors just under one FP32 step there: noise
step = fp32_step(1e4)
check(f"one FP32 step at 1e4 is 2^-10 ({step})", step == 2.0 ** -10)
for scale, size, noisy in ((1e4, 0.9 * step, True), (1e4, 1.1 * step, False), (60.0, 0.9 * step, False),
                           (60.0, 0.9e-4, True), (1.0, 0.9e-4, True), (1.0, 1.1e-4, False)):
    c = [row(scale, delta_bias=0.8, delta_rel_l2=size)]
    g = [row(scale, delta_bias=0.3, delta_rel_l2=size)]
    rc, out = run(c, g)
    want = "clear biases that differ: 0 (+1" if noisy else "clear biases that differ: 1 (+0"
    check(f"logits {scale}, relative error {size:.3g}: {'noise' if noisy else 'reported'} (rc {rc}): {out}",
          rc == (0 if noisy else 1) and want in out)

# 4. biases that agree in sign and within a factor of two, or are small on both sides, pass
for a, b in ((0.8, 0.5), (0.15, -0.15), (-0.3, -0.2)):
    rc, out = run([row(8.0, o_bias=a)], [row(8.0, o_bias=b)])
    check(f"O bias {a} against {b} is no different conclusion (rc {rc}): {out}", rc == 0)

# 5. event counts are counted, not failed
rc, out = run([row(8.0, nonfinite=448)], [row(8.0, nonfinite=640)])
check(f"an event-count difference is counted (rc {rc}): {out}", rc == 0 and "event-count fields that differ: 1" in out)

# 6. different grids, an empty audit and a malformed row end with a message naming the file
rc, out = run([row(8.0)], [row(60.0)])
check(f"different rows fail with a message (rc {rc}): {out}", rc != 0 and "cover different rows" in out)
rc, out = run([], [])
check(f"an empty audit fails (rc {rc}): {out}", rc != 0 and "no rows" in out)
rc, out = run(['{"D": 64}'], [row(8.0)])
check(f"a malformed row names the file and line (rc {rc}): {out}", rc != 0 and "cpu.jsonl:1" in out and "not an audit row" in out)

check.finish("audit_compare: all checks passed")

"""`stableflash attention --device cuda` against the PyTorch op on the same inputs, byte for byte: since
739ba72 the CLI's outputs are the fast path's (forward_from_host runs a second forward without the
counters that would take the units walk), i.e. the op's. Forward only (no `do` in the input), the
standard and hashed_offset shifts, D 64 and 128 (the log2-unit scores), causal and full, 1,000 keys
(the warp-specialized kernel). Exit status 1 on any difference.

    GPU machine, the wheel on PYTHONPATH and the devbin's libraries set (scripts/device-libs.sh):
    python3 cli_vs_op.py build-cuda/devbin/stableflash WORKDIR
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

import stableflash.torch as sft

cli, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
bad = 0
for d in (64, 128):
    for causal in (False, True):
        for policy in ("standard", "hashed_offset"):
            g = torch.Generator().manual_seed(d + causal)
            q, k, v = (torch.randn(1, 8, 1000, d, generator=g).to(torch.bfloat16) for _ in range(3))
            src, dst = f"{work}/in-{d}.safetensors", f"{work}/out-{d}-{causal}-{policy}.safetensors"
            save_file({"q": q, "k": k, "v": v}, src)
            args = [cli, "attention", src, "-o", dst, "--device", "cuda", "--layout", "bhtd", "--policy", policy]
            if causal:
                args.append("--causal")
            run = subprocess.run(args, capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"{' '.join(args)}: exit status {run.returncode}\n{run.stderr}")
            o_cli = load_file(dst)["o"]
            with torch.no_grad():
                o_op = sft.attention(q.cuda(), k.cuda(), v.cuda(), causal=causal, layout="bhtd", policy=policy).cpu()
            differ = int((o_cli.view(torch.int16) != o_op.view(torch.int16)).sum())
            print(f"D {d} {'causal' if causal else 'full'} {policy}: {f'{differ} elements differ' if differ else 'same bytes'}")
            bad += differ > 0
print("CLI vs op: " + ("all the same bytes" if not bad else f"{bad} comparisons differ"))
sys.exit(1 if bad else 0)

#!/usr/bin/env python3
"""The GPU work of one attention backward through the op (autograd) or through the C ABI, for a
kernel profiler: bench_op.py finds the op's backward ~1-3% slower than the C ABI's at the GPT-2
shape while the op's host time per call (~0.12 ms) stays below the GPU's (~0.32 ms), so the
difference should be on the GPU. Under Nsight Compute each path lists its kernels and their times:

    ncu --print-summary per-kernel python3 tests/python_gpu/profile_op_backward.py --path op
    ncu --print-summary per-kernel python3 tests/python_gpu/profile_op_backward.py --path capi

Both run the same shape, options and inputs; the forward runs once before (outside the counted
calls: compare the per-kernel counts, `--calls` of each backward kernel)."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_op import DELTA, POLICY  # noqa: E402  the op's defaults, as bench_op times them
from stableflash import _capi  # noqa: E402
import stableflash.torch as sft  # noqa: E402
from stableflash.torch import DEFAULTS, _ops, attention  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", choices=("op", "capi"), required=True)
    p.add_argument("--calls", type=int, default=5)
    a = p.parse_args()
    b, h, t, d, causal = 16, 12, 1024, 64, True
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
    if a.path == "op":
        o = attention(q, k, v, causal=causal, policy=POLICY, delta_source=DELTA)
        call = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    else:
        opts = _ops.parse_options(sft._text(DEFAULTS["numerics"], POLICY, DELTA, False, None), causal, 0.0, "cuda")
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        o, lse, res = torch.empty_like(qd), torch.empty(qd.shape[:3], device="cuda"), torch.empty_like(qd)
        dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
        tt = {n: _ops._tensor(x) for n, x in dict(q=qd, k=kd, v=vd, o=o, res=res, do=do, dq=dq, dk=dk, dv=dv).items()}
        shape, stream = _ops._shape(qd, kd), torch.cuda.current_stream().cuda_stream
        _capi.forward(shape, opts, stream, tt["q"], tt["k"], tt["v"], tt["o"], lse.data_ptr(), tt["res"])
        call = lambda: _capi.backward(shape, opts, stream, tt["q"], tt["k"], tt["v"], tt["o"], lse.data_ptr(), tt["res"], tt["do"],
                                      tt["dq"], tt["dk"], tt["dv"])
    for _ in range(a.calls):
        call()
    torch.cuda.synchronize()
    print(f"profile_op_backward: {a.calls} backward calls through {a.path}")


if __name__ == "__main__":
    main()

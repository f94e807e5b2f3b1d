#!/usr/bin/env python3
"""The GPU work of one attention backward through the op (autograd) or through the C ABI: where
bench_op.py's single calls of the op's backward lose 2-4% against the C ABI's at the GPT-2 shape.
Under Nsight Compute each path lists its kernels and their times (the same three kernels, equally
long: docs/python.md):

    ncu --print-summary per-kernel python3 tests/python_gpu/profile_op_backward.py --path op
    ncu --print-summary per-kernel python3 tests/python_gpu/profile_op_backward.py --path capi

Both run the same shape, options and inputs; the forward runs once before (outside the counted
calls: compare the per-kernel counts, `--calls` of each backward kernel).

    python3 tests/python_gpu/profile_op_backward.py --timeline

instead records both paths' back-to-back calls with torch.profiler (no kernel replay, the GPU's own
timeline) and prints per path the GPU time per call, each kernel's mean duration and the mean idle
time before it: where the op's backward loses time against the C ABI's, in the kernels or between
them (between: before each call's first kernel, docs/python.md)."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_op import DELTA, POLICY  # noqa: E402  the op's defaults, as bench_op times them
from stableflash import _capi  # noqa: E402
import stableflash.torch as sft  # noqa: E402
from stableflash.torch import DEFAULTS, _ops, attention  # noqa: E402


def timeline(name, call, calls):
    """Prints the GPU timeline of `calls` back-to-back calls: per kernel, mean duration and mean gap
    before it (from the previous GPU activity's end), and the span per call."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    gpu = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    per = {}
    for prev, e in zip(gpu, gpu[1:]):
        d = per.setdefault(e.name[:60], [0, 0.0, 0.0])
        d[0] += 1
        d[1] += e.time_range.end - e.time_range.start
        d[2] += max(0.0, e.time_range.start - prev.time_range.end)
    span = (gpu[-1].time_range.end - gpu[0].time_range.start) / (calls - 1)
    gaps = sum(d[2] for d in per.values()) / (calls - 1)
    print(f"{name}: {span:.1f} us of GPU timeline per call, {gaps:.1f} us of it idle")
    for k, (n, dur, gap) in sorted(per.items(), key=lambda x: -x[1][1]):
        print(f"    {k:60s} x{n:4d}  {dur / n:8.2f} us  idle before {gap / n:6.2f} us")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", choices=("op", "capi"))
    p.add_argument("--timeline", action="store_true", help="both paths under torch.profiler")
    p.add_argument("--calls", type=int, default=5)
    a = p.parse_args()
    b, h, t, d, causal = 16, 12, 1024, 64, True
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
    if not a.timeline and not a.path:
        p.error("--path op|capi, or --timeline")
    calls = {}
    if a.timeline or a.path == "op":
        out = attention(q, k, v, causal=causal, policy=POLICY, delta_source=DELTA)
        calls["op"] = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    if a.timeline or a.path == "capi":
        opts = _ops.parse_options(sft._text(DEFAULTS["numerics"], POLICY, DELTA, False, None), causal, 0.0, "cuda")
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        o, lse, res = torch.empty_like(qd), torch.empty(qd.shape[:3], device="cuda"), torch.empty_like(qd)
        dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
        tt = {n: _ops._tensor(x) for n, x in dict(q=qd, k=kd, v=vd, o=o, res=res, do=do, dq=dq, dk=dk, dv=dv).items()}
        shape, stream = _ops._shape(qd, kd), torch.cuda.current_stream().cuda_stream
        _capi.forward(shape, opts, stream, tt["q"], tt["k"], tt["v"], tt["o"], lse.data_ptr(), tt["res"])
        calls["capi"] = lambda: _capi.backward(shape, opts, stream, tt["q"], tt["k"], tt["v"], tt["o"], lse.data_ptr(),
                                               tt["res"], tt["do"], tt["dq"], tt["dk"], tt["dv"])
    if a.timeline:
        for _ in range(2):  # alternating
            for name, call in calls.items():
                timeline(name, call, max(a.calls, 100))
        return
    for _ in range(a.calls):
        calls[a.path]()
    torch.cuda.synchronize()
    print(f"profile_op_backward: {a.calls} backward calls through {a.path}")


if __name__ == "__main__":
    main()

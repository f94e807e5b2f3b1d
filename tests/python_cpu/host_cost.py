#!/usr/bin/env python3
"""The host's per-call cost of stableflash.torch.attention over calling the C ABI directly (issue 14),
measured on a shape so small that the attention itself costs little: B = H = 1, T = 16, D = 64.
Not a test: it prints per-call wall times of

  op forward           attention(q, k, v) under no_grad
  op forward, grad     the same with q, k, v requiring grad (records the autograd node)
  op backward          torch.autograd.grad(o, (q, k, v), dO, retain_graph=True), as bench_op.py times it
  C ABI forward/bwd    _capi.forward / _capi.backward on preallocated tensors and prebuilt arguments

and the difference (op - C ABI: what the op adds per call), then a breakdown of the op's pieces, each
timed alone in a loop. Per-call times are the least over windows of back-to-back calls. On the CPU the C ABI runs the CPU oracle (single-threaded here, OMP_NUM_THREADS=1,
so that OpenMP's idle threads do not compete with Python for the cores); on CUDA (--device cuda) the
kernels are short enough at this shape that the loop is bound by the host, and every window ends with
a synchronisation.

    STABLEFLASH_C_LIB=build/capi/libstableflash_c.so PYTHONPATH=python:<torch> python3 tests/python_cpu/host_cost.py
"""
import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch and the library load libgomp

import torch  # noqa: E402

from stableflash import _capi  # noqa: E402
from stableflash.torch import _layout, _ops, attention  # noqa: E402

OPTIONS = "numerics=fused;policy=hashed_offset;delta_source=compensated;deterministic=false"


def per_call_us(fn, device, windows=21, window_s=0.02):
    """The least over windows of the mean per-call time of back-to-back calls, in µs: the host's cost
    where nothing else took the core (this machine's other load only ever adds)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(50):
        fn()
    sync()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < window_s:
        fn()
        n += 1
    sync()
    res = []
    for _ in range(windows):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        sync()
        res.append((time.perf_counter_ns() - t0) / n / 1e3)
    return min(res)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", default="1,1,16,64", help="B,H,T,D")
    p.add_argument("--no-breakdown", action="store_true")
    a = p.parse_args()
    dev = a.device
    torch.set_num_threads(1)
    b, h, t, d = (int(x) for x in a.shape.split(","))
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, device=dev).to(torch.bfloat16).requires_grad_() for _ in range(3))
    d_o = torch.randn(b, h, t, d, device=dev).to(torch.bfloat16)
    kw = dict(causal=True, policy="hashed_offset", delta_source="compensated")

    def op_forward():
        with torch.no_grad():
            attention(q, k, v, **kw)

    def op_forward_grad():
        attention(q, k, v, **kw)

    o = attention(q, k, v, **kw)

    def op_backward():
        torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True)

    # the C ABI called directly: arguments built once, as tests/python_gpu/bench_op.py does
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    opts = _ops.parse_options(OPTIONS, True, 0.0, dev)
    o_, lse, res = torch.empty_like(qd), torch.empty(qd.shape[:3], device=dev), torch.empty_like(qd)
    dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
    c = {n: _ops._tensor(x) for n, x in dict(q=qd, k=kd, v=vd, o=o_, res=res, do=d_o, dq=dq, dk=dk, dv=dv).items()}
    shape = _ops._shape(qd, kd)
    stream = torch.cuda.current_stream().cuda_stream if dev == "cuda" else None
    lse_ptr = lse.data_ptr()

    def c_forward():
        _capi.forward(shape, opts, stream, c["q"], c["k"], c["v"], c["o"], lse_ptr, c["res"])

    def c_backward():
        _capi.backward(shape, opts, stream, c["q"], c["k"], c["v"], c["o"], lse_ptr, c["res"], c["do"], c["dq"], c["dk"],
                       c["dv"])

    c_forward()
    times = {name: per_call_us(fn, dev) for name, fn in (
        ("op forward", op_forward), ("op forward, grad", op_forward_grad), ("op backward", op_backward),
        ("C ABI forward", c_forward), ("C ABI backward", c_backward))}
    print(f"torch {torch.__version__}, {dev}, shape {b}x{h}x{t}x{d} causal, {OPTIONS}")
    print("| call | µs per call | op - C ABI |")
    print("|---|---|---|")
    for name, us in times.items():
        base = times["C ABI backward" if "backward" in name else "C ABI forward"]
        extra = f"{us - base:.1f}" if name.startswith("op") else ""
        print(f"| {name} | {us:.1f} | {extra} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The host's per-call cost of stableflash.torch.attention over calling the C ABI directly (issue 14),
measured on a shape so small that the attention itself costs little: B = H = 1, T = 16, D = 64.
Not a test: it prints per-call wall times of

  op forward           attention(q, k, v) under no_grad
  op forward, grad     the same with q, k, v requiring grad (records the autograd node)
  op backward          torch.autograd.grad(o, (q, k, v), dO, retain_graph=True), as bench_op.py times it
  C ABI forward/bwd    _capi.forward / _capi.backward on preallocated tensors and prebuilt arguments

and the difference (op - C ABI: what the op adds per call), then a breakdown of the op's pieces
(python/stableflash/torch/_ops.py), each timed alone in a loop. On the CPU the C ABI runs the CPU oracle (single-threaded here, OMP_NUM_THREADS=1,
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
import stableflash.torch as sft  # noqa: E402
from stableflash.torch import _ops, attention  # noqa: E402


def per_call_us(fns, device, rounds=25, window_s=0.01):
    """{name: µs per call} for a dict of functions: the least over windows of the mean per-call time
    of back-to-back calls, the windows of all functions taken in turn (round after round), so that
    they all meet the machine in the same states. On the CPU the calling thread's CPU time
    (time.thread_time_ns), which is all of the work here (the library runs single-threaded,
    OMP_NUM_THREADS=1, and autograd runs a CPU backward on the calling thread) and none of the time
    other processes take the core. On CUDA, wall time, each window ended by a synchronisation."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    clock = time.perf_counter_ns if device == "cuda" else time.thread_time_ns
    calls = {}
    for name, fn in fns.items():  # warm up, and size each function's window
        for _ in range(20):
            fn()
        sync()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < window_s:
            fn()
            n += 1
        sync()
        calls[name] = n
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            n = calls[name]
            t0 = clock()
            for _ in range(n):
                fn()
            sync()
            best[name] = min(best[name], (clock() - t0) / n / 1e3)
    return best


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
    text = sft._text(sft.DEFAULTS["numerics"], kw["policy"], kw["delta_source"], False, None)  # what the op sends

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
    opts = _ops.parse_options(text, True, 0.0, dev)
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
    times = per_call_us({"op forward": op_forward, "op forward, grad": op_forward_grad, "op backward": op_backward,
                         "C ABI forward": c_forward, "C ABI backward": c_backward}, dev)
    print(f"torch {torch.__version__}, {dev}, shape {b}x{h}x{t}x{d} causal, {text}")
    print("| call | µs per call | op - C ABI |")
    print("|---|---|---|")
    for name, us in times.items():
        base = times["C ABI backward" if "backward" in name else "C ABI forward"]
        extra = f"{us - base:.1f}" if name.startswith("op") else ""
        print(f"| {name} | {us:.1f} | {extra} |")
    if a.no_breakdown:
        return

    # The pieces, each alone in a loop (so they add up only roughly: caches are warmer than in the call)
    class Trivial(torch.autograd.Function):  # autograd's own cost: six saved tensors, three fresh gradients
        @staticmethod
        def forward(ctx, q_, k_, v_):
            ctx.save_for_backward(q_, k_, v_, q_, k_, v_)
            return q_.clone(), q_.new_empty(0), q_.new_empty(0)

        @staticmethod
        def backward(ctx, g, _g1, _g2):
            saved = ctx.saved_tensors
            return tuple(torch.empty_like(x) for x in saved[:3])

    o_trivial = Trivial.apply(q, k, v)[0]
    fwd_args = (qd, kd, vd, True, 0.0, text)
    with torch.no_grad():
        saved = [x.detach() for x in _ops._FORWARD(*fwd_args)]
    bwd_args = (d_o, qd, kd, vd, *saved, True, 0.0, text)

    def no_grad(fn):
        def call():
            with torch.no_grad():
                fn()
        return call

    pieces = [
        ("attention(): argument checks (_check)", lambda: sft._check(q, k, v, "bhtd"), "per call"),
        ("attention(): the options string (_text, cached)", lambda: sft._text("fused", "hashed_offset", "compensated", False, None),
         "per call"),
        ("route check (_ops._plain)", lambda: _ops._plain(q, k, v), "forward and backward"),
        ("parsed options (_ops.parse_options, cached)", lambda: _ops.parse_options(text, True, 0.0, dev), "forward and backward"),
        ("forward outputs o, lse, o_residual", lambda: _ops._forward_outputs(qd, True), "forward"),
        ("forward kernel: all of it", lambda: _ops._forward_kernel(*fwd_args), "forward: minus C ABI = its Python"),
        ("the op through the dispatcher, no grad", no_grad(lambda: _ops._FORWARD(*fwd_args)), "what plain eager skips"),
        ("backward outputs dq, dk, dv", lambda: _ops._backward_outputs(qd, kd, vd), "backward"),
        ("backward kernel: all of it", lambda: _ops._backward_kernel(*bwd_args), "backward: minus C ABI = its Python"),
        ("the backward op through the dispatcher", no_grad(lambda: _ops._BACKWARD(*bwd_args)), "what plain eager skips"),
        ("autograd.grad through a trivial Function", lambda: torch.autograd.grad(o_trivial, (q, k, v), d_o, retain_graph=True),
         "autograd's floor for a backward"),
    ]
    print()
    print("| piece | µs per call | where |")
    print("|---|---|---|")
    times = per_call_us({name: fn for name, fn, _ in pieces}, dev, rounds=9)
    for name, _, where in pieces:
        print(f"| {name} | {times[name]:.1f} | {where} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How much the PyTorch op costs over calling the C++ entry point directly: a ratio, not a timed
test (issue 14: within 3%). Each line times the same shape three ways, all with torch_peers.py's
method (warm-up, windows of back-to-back calls between two CUDA events, median per-call time); the
op and the C ABI in three alternating rounds, the median of each:

  op      stableflash.torch.attention: forward under no_grad, backward as autograd.grad of a
          retained graph (what a training step pays: output allocation, custom-op dispatch, autograd)
  C ABI   the library's sf_attention_forward/backward through ctypes on preallocated tensors
  C++     `stableflash bench attention` (cuda::bench, the C++ entry points timed the same way in
          C++), when $SF_BIN holds the program (scripts/device-check.sh sets it)

and, per attention call, a chain of LAYERS calls (GPT-2 124M's depth; layer i's query is layer
i - 1's output, each layer its own k and v), the op's forward with autograd recording and one
autograd.grad through all of them against the C ABI's forwards and backwards of the same chain: a
training step runs every layer's attention backward in one autograd pass, which pays the engine's
fixed cost per pass (a CUDA backward runs on autograd's device thread: a hand-off and a wake-up of
the caller) once, not per call as the single-call line does. The goal is judged there, on the
shapes and directions where the GPU is the bound; one whose kernels take less time per call than the
op's host work is reported as bound by the host (Python and autograd, which no kernel change moves). SDPA's
cuDNN backend is timed both ways too: PyTorch's own attention pays the same per-pass cost.

    PYTHONPATH=<wheel dir> SF_PEERS=<dir of torch_peers.py> python3 tests/python_gpu/bench_op.py [--quick] [--json FILE]
--quick: the first shape only (GPT-2's, causal).
Exit status 0 unless something fails to run; the ratios are printed for a person to judge.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from stableflash import _capi
import stableflash.torch as sft
from stableflash.torch import DEFAULTS, _ops, attention

HERE = os.path.dirname(os.path.abspath(__file__))
ROUNDS = 3  # op and C ABI measured alternately, medians taken
LAYERS = 12  # the chain's length: GPT-2 124M's layers
SHAPES = [(16, 12, 1024, 64, True), (8, 16, 4096, 128, True), (4, 16, 512, 64, False)]
POLICY, DELTA = DEFAULTS["policy"], DEFAULTS["delta_source"]  # the op's defaults (standard, compensated)


def peers_module():
    for d in (os.environ.get("SF_PEERS"), os.path.join(HERE, "../../.peers"), os.path.join(HERE, "../../../shared/peers")):
        if d and os.path.isfile(os.path.join(d, "torch_peers.py")):
            sys.path.insert(0, d)
            import torch_peers
            return torch_peers
    sys.exit("bench_op: no torch_peers.py (set SF_PEERS to its folder)")


def host_ms(fn, calls=20):
    """The host's time per call while the GPU is kept busy (a sleep queued first), so that no call
    waits for the GPU: where this reaches the GPU time per call, back-to-back calls are bound by the
    host and the ratios above measure Python, not the kernels."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU time, longer than the calls' host time
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    return 1e3 * host


def time_op(per_call_ms, q, k, v, do, causal):
    """GPU ms per call of the forward and the backward, then their host ms per call."""
    def fwd():
        with torch.no_grad():
            attention(q, k, v, causal=causal, policy=POLICY, delta_source=DELTA)
    o = attention(q, k, v, causal=causal, policy=POLICY, delta_source=DELTA)
    bwd = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    return per_call_ms(fwd), per_call_ms(bwd), host_ms(fwd), host_ms(bwd)


def time_c_abi(per_call_ms, q, k, v, do, causal):
    # the options string the op sends for these arguments, parsed as the op parses it
    opts = _ops.parse_options(sft._text(DEFAULTS["numerics"], POLICY, DELTA, False, None), causal, 0.0, "cuda")
    o, lse, res = (torch.empty_like(q), torch.empty(q.shape[:3], device="cuda"), torch.empty_like(q))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    t = {n: _ops._tensor(x) for n, x in dict(q=q, k=k, v=v, o=o, res=res, do=do, dq=dq, dk=dk, dv=dv).items()}
    shape, stream = _ops._shape(q, k), torch.cuda.current_stream().cuda_stream
    fwd = lambda: _capi.forward(shape, opts, stream, t["q"], t["k"], t["v"], t["o"], lse.data_ptr(), t["res"])
    fwd()
    bwd = lambda: _capi.backward(shape, opts, stream, t["q"], t["k"], t["v"], t["o"], lse.data_ptr(), t["res"], t["do"],
                                 t["dq"], t["dk"], t["dv"])
    return per_call_ms(fwd), per_call_ms(bwd), host_ms(fwd), host_ms(bwd)


class _NoOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def engine_ms():
    """Host ms of one autograd.grad through a Function of a CUDA tensor that launches no kernel:
    what every backward pass pays before and after its first CUDA node, whatever the op."""
    x = torch.zeros(8, device="cuda", requires_grad=True)
    y, g = _NoOp.apply(x), torch.ones(8, device="cuda")
    return host_ms(lambda: torch.autograd.grad(y, x, g, retain_graph=True), calls=200)


def time_op_chain(per_call_ms, q, k, v, do, causal):
    """GPU ms per attention call of a LAYERS-call chain's forward (autograd recording) and of its
    backward (one autograd.grad), then their host ms per call."""
    ks, vs = ([x.detach().clone().requires_grad_() for _ in range(LAYERS)] for x in (k, v))

    def fwd():
        y = q
        for i in range(LAYERS):
            y = attention(y, ks[i], vs[i], causal=causal, policy=POLICY, delta_source=DELTA)
        return y
    o = fwd()
    inputs = (q, *ks, *vs)
    bwd = lambda: torch.autograd.grad(o, inputs, do, retain_graph=True)
    return [x / LAYERS for x in (per_call_ms(fwd), per_call_ms(bwd), host_ms(fwd), host_ms(bwd))]


def time_c_abi_chain(per_call_ms, q, k, v, do, causal):
    """The same chain through the C ABI on preallocated tensors: LAYERS forwards, then LAYERS backwards
    (layer i's dq is layer i - 1's dO), per call."""
    opts = _ops.parse_options(sft._text(DEFAULTS["numerics"], POLICY, DELTA, False, None), causal, 0.0, "cuda")
    shape, stream = _ops._shape(q, k), torch.cuda.current_stream().cuda_stream
    qs = [q] + [torch.empty_like(q) for _ in range(LAYERS)]  # qs[i + 1] is layer i's output
    ks, vs = ([x.clone() for _ in range(LAYERS)] for x in (k, v))
    lses = [torch.empty(q.shape[:3], device="cuda") for _ in range(LAYERS)]
    ress = [torch.empty_like(q) for _ in range(LAYERS)]
    dqs = [torch.empty_like(q) for _ in range(LAYERS)] + [do]  # dqs[i + 1] is layer i's dO
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    t = _ops._tensor
    fwd_calls = [(shape, opts, stream, t(qs[i]), t(ks[i]), t(vs[i]), t(qs[i + 1]), lses[i].data_ptr(), t(ress[i]))
                 for i in range(LAYERS)]
    bwd_calls = [(shape, opts, stream, t(qs[i]), t(ks[i]), t(vs[i]), t(qs[i + 1]), lses[i].data_ptr(), t(ress[i]),
                  t(dqs[i + 1]), t(dqs[i]), t(dk), t(dv)) for i in reversed(range(LAYERS))]

    def fwd():
        for c in fwd_calls:
            _capi.forward(*c)

    def bwd():
        for c in bwd_calls:
            _capi.backward(*c)
    fwd()
    return [x / LAYERS for x in (per_call_ms(fwd), per_call_ms(bwd), host_ms(fwd), host_ms(bwd))]


def time_sdpa_backward(per_call_ms, q, k, v, do, causal):
    """SDPA's cuDNN backend, backward GPU ms for a single call and per call of a LAYERS-call pass: the
    same autograd cost shows in PyTorch's own attention (None where the backend does not run)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ks, vs = ([x.detach().clone().requires_grad_() for _ in range(LAYERS)] for x in (k, v))
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o1 = sdpa(q, k, v, is_causal=causal)
            y = q
            for i in range(LAYERS):
                y = sdpa(y, ks[i], vs[i], is_causal=causal)
            single = per_call_ms(lambda: torch.autograd.grad(o1, (q, k, v), do, retain_graph=True))
            inputs = (q, *ks, *vs)
            in_pass = per_call_ms(lambda: torch.autograd.grad(y, inputs, do, retain_graph=True)) / LAYERS
    except RuntimeError as e:
        print(f"    SDPA cuDNN: {str(e).splitlines()[0]}")
        return None
    return single, in_pass


def time_cpp(b, h, t, d, causal):
    sf = os.path.join(os.environ.get("SF_BIN", ""), "stableflash")
    if not os.environ.get("SF_BIN") or not os.access(sf, os.X_OK):
        return None
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        subprocess.run([sf, "bench", "attention", "--shapes", f"{b}x{h}x{t}x{d}:{'causal' if causal else 'full'}",
                        "--numerics", "fused", "--policy", POLICY, "--delta-source", DELTA, "--no-check",
                        "--json", f.name], check=True, stdout=subprocess.DEVNULL)
        r = json.loads(open(f.name).readline())
    return r["fwd_ms"], r["bwd_ms"]


def summary(rows):
    """The goal's line. Per shape and direction, per call of the LAYERS-layer pass: a direction whose
    kernels take less GPU time per call than the op's host work is bound by the host (Python and
    autograd, which no kernel change moves; at small shapes every op written in Python is), and is
    listed apart; the goal (within 3%) is judged on the others, and single calls are given beside."""
    lines, judged, single = [], [], []
    for r in rows:
        shape = f"{r['B']},{r['H']},{r['T']},{r['D']}"
        for way in ("fwd", "bwd"):
            ratio = r[f"chain_op_{way}_ms"] / r[f"chain_c_abi_{way}_ms"]
            host, gpu = r[f"chain_op_{way}_host_ms"], r[f"chain_c_abi_{way}_ms"]
            if host >= gpu:
                lines.append(f"    {shape} {way} is bound by the host: the op's host time per call in the pass {host:.4f} ms "
                             f"reaches the kernels' {gpu:.4f} ms; op / C ABI there {ratio:.3f}")
            else:
                judged.append(ratio)
                single.append(r[f"op_{way}_ms"] / r[f"c_abi_{way}_ms"])
    if judged:
        worst = max(judged)
        lines.append(f"largest op / C ABI ratio: {worst:.3f} per call of a {LAYERS}-layer pass where the GPU is the bound "
                     f"({'within' if worst <= 1.03 else 'NOT within'} 3%); {max(single):.3f} for single calls")
    else:
        lines.append("largest op / C ABI ratio: none measured where the GPU is the bound")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="append one JSON object per shape")
    p.add_argument("--quick", action="store_true", help="the first shape only")
    a = p.parse_args()
    per_call_ms = peers_module().per_call_ms
    rows = []
    print(f"| shape (B,H,T,D) | mask | op fwd ms | C ABI fwd | C++ fwd | op bwd ms | C ABI bwd | C++ bwd | "
          f"op/C ABI fwd | op/C ABI bwd | op/C++ fwd | op/C++ bwd |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for b, h, t, d, causal in SHAPES[:1] if a.quick else SHAPES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
        # Rounds alternate the two paths and each figure is the median over the rounds: a drift of
        # the GPU's clocks during the run then favours neither (one op run, then one C ABI run, did).
        rounds = [(time_op(per_call_ms, q, k, v, do, causal), time_c_abi(per_call_ms, q.detach(), k.detach(), v.detach(), do, causal))
                  for _ in range(ROUNDS)]
        op, c_abi = ([statistics.median(r[path][i] for r in rounds) for i in range(4)] for path in (0, 1))
        cpp = time_cpp(b, h, t, d, causal)
        ratio = lambda x, y: f"{x / y:.3f}" if y else "-"
        fmt = lambda x: f"{x:.4f}" if x is not None else "-"
        print(f"| {b},{h},{t},{d} | {'causal' if causal else 'full'} | {op[0]:.4f} | {c_abi[0]:.4f} | "
              f"{fmt(cpp and cpp[0])} | {op[1]:.4f} | {c_abi[1]:.4f} | {fmt(cpp and cpp[1])} | {ratio(op[0], c_abi[0])} | "
              f"{ratio(op[1], c_abi[1])} | {ratio(op[0], cpp and cpp[0])} | {ratio(op[1], cpp and cpp[1])} |", flush=True)
        rows.append({"B": b, "H": h, "T": t, "D": d, "causal": causal, "policy": POLICY, "delta_source": DELTA,
                     "op_fwd_ms": op[0], "op_bwd_ms": op[1], "c_abi_fwd_ms": c_abi[0], "c_abi_bwd_ms": c_abi[1],
                     "cpp_fwd_ms": cpp and cpp[0], "cpp_bwd_ms": cpp and cpp[1]})
        print(f"    host ms per call (GPU kept busy): op fwd {op[2]:.4f}, bwd {op[3]:.4f}; C ABI fwd {c_abi[2]:.4f}, "
              f"bwd {c_abi[3]:.4f}", flush=True)
        rows[-1].update(op_fwd_host_ms=op[2], op_bwd_host_ms=op[3], c_abi_fwd_host_ms=c_abi[2], c_abi_bwd_host_ms=c_abi[3])
        chain = [(time_op_chain(per_call_ms, q, k, v, do, causal),
                  time_c_abi_chain(per_call_ms, q.detach(), k.detach(), v.detach(), do, causal)) for _ in range(ROUNDS)]
        op, c_abi = ([statistics.median(r[path][i] for r in chain) for i in range(4)] for path in (0, 1))
        print(f"| {b},{h},{t},{d} | {'causal' if causal else 'full'}, per call of a {LAYERS}-layer pass | {op[0]:.4f} | "
              f"{c_abi[0]:.4f} | - | {op[1]:.4f} | {c_abi[1]:.4f} | - | {ratio(op[0], c_abi[0])} | {ratio(op[1], c_abi[1])} "
              f"| - | - |", flush=True)
        print(f"    host ms per call in the pass (GPU kept busy): op fwd {op[2]:.4f}, bwd {op[3]:.4f}; C ABI fwd "
              f"{c_abi[2]:.4f}, bwd {c_abi[3]:.4f}", flush=True)
        rows[-1].update(chain_layers=LAYERS, chain_op_fwd_ms=op[0], chain_op_bwd_ms=op[1], chain_c_abi_fwd_ms=c_abi[0],
                        chain_c_abi_bwd_ms=c_abi[1], chain_op_fwd_host_ms=op[2], chain_op_bwd_host_ms=op[3],
                        chain_c_abi_fwd_host_ms=c_abi[2], chain_c_abi_bwd_host_ms=c_abi[3])
        del chain
        torch.cuda.empty_cache()
        sdpa = time_sdpa_backward(per_call_ms, q, k, v, do, causal)
        if sdpa:
            print(f"    SDPA cuDNN backward through autograd (GPU ms): single call {sdpa[0]:.4f}, per call of a "
                  f"{LAYERS}-layer pass {sdpa[1]:.4f} ({sdpa[0] / sdpa[1]:.3f}x)", flush=True)
            rows[-1].update(sdpa_cudnn_bwd_ms=sdpa[0], chain_sdpa_cudnn_bwd_ms=sdpa[1])
        torch.cuda.empty_cache()
    print(f"    autograd's fixed cost per pass: host ms of autograd.grad through a CUDA Function that launches nothing "
          f"{engine_ms():.4f}")
    print(summary(rows))
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

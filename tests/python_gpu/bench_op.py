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
    worst = max(max(r["op_fwd_ms"] / r["c_abi_fwd_ms"], r["op_bwd_ms"] / r["c_abi_bwd_ms"]) for r in rows)
    print(f"largest op / C ABI ratio: {worst:.3f} ({'within' if worst <= 1.03 else 'NOT within'} 3%)")
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

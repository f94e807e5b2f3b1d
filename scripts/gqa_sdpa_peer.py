#!/usr/bin/env python3
"""Grouped-query attention speed of PyTorch SDPA backends (enable_gqa=True), beside our kernels.

The shared peer script (shared/peers/torch_peers.py, not ours to change) times multi-head shapes
only; this one times k, v with fewer heads than q and otherwise is that script's `attention` mode:
its timing function and backend table are imported from it, so the method is the same to the line
(warm-up, windows of back-to-back calls between one pair of CUDA events, median per-call time;
forward under no_grad, backward as autograd.grad of a retained graph), behind scripts/peer_timing.py's
untimed first call and --warmup seconds of warm-up, as the multi-head shapes are timed. FLOPs count the query heads,
as `stableflash bench attention` does: forward 4·B·H·T²·D, halved when causal; backward 2.5x.

  python3 scripts/gqa_sdpa_peer.py --peers .peers --B 2 --H 64 --Hkv 8 --T 4096 --D 128 --causal

Prints one JSON object on its last line (torch_peers.py's fields plus "Hkv"); details on stderr.
"""
import argparse, json, os, sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default=os.environ.get("STABLEFLASH_PEERS", ".peers"), help="folder holding torch_peers.py")
    for n, d in (("B", 2), ("H", 64), ("Hkv", 8), ("T", 4096), ("D", 128), ("seed", 0)):
        ap.add_argument(f"--{n}", type=int, default=d)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--backends", default="flash,cudnn")
    ap.add_argument("--warmup", type=float, default=None, help="seconds of warm-up (peer_timing.py's default)")
    a = ap.parse_args()
    if a.H % a.Hkv:
        sys.exit(f"--Hkv {a.Hkv} must divide --H {a.H}")
    sys.path.insert(0, a.peers)
    from torch_peers import BACKENDS, backend_list, per_call_ms as peer_per_call_ms  # the peer's timing, unchanged
    from peer_timing import DEFAULT_WARMUP_S, steady

    per_call_ms = steady(peer_per_call_ms, DEFAULT_WARMUP_S if a.warmup is None else a.warmup)

    torch.manual_seed(a.seed)
    q = torch.randn((a.B, a.H, a.T, a.D), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn((a.B, a.Hkv, a.T, a.D), device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn((a.B, a.H, a.T, a.D), device="cuda", dtype=torch.bfloat16)
    fwd_flop = 4 * a.B * a.H * a.T * a.T * a.D / (2 if a.causal else 1)
    out = {"B": a.B, "H": a.H, "Hkv": a.Hkv, "T": a.T, "D": a.D, "causal": a.causal, "device": torch.cuda.get_device_name(),
           "method": "median over windows of back-to-back calls (torch_peers.per_call_ms, peer_timing.steady)"}
    for name in backend_list(a.backends):
        try:
            with sdpa_kernel([BACKENDS[name]]):
                def fwd():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=a.causal, enable_gqa=True)
                t_f = per_call_ms(fwd)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=a.causal, enable_gqa=True)
                t_b = per_call_ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
            out[name] = {"fwd_ms": t_f, "bwd_ms": t_b, "fwd_tflops": fwd_flop / t_f / 1e9,
                         "bwd_tflops": 2.5 * fwd_flop / t_b / 1e9}
        except RuntimeError as e:  # a backend may not take grouped-query heads or a shape
            out[name] = {"error": str(e)[:200]}
        print(name, out[name], file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The PyTorch peers timed in the power state our benchmark is timed in: steady load.

torch_peers.py (shared/peers, not ours to change) times with per_call_ms: a synchronous warm-up of
0.3 s that starts before the first call, then 7 windows of >= 20 ms. SDPA's cuDNN backend builds
and compiles its plan inside that first call, for up to seconds with the GPU near idle, so the
warm-up ends after three calls and the windows run on a GPU that has just idled: at the 1980 MHz
boost clock while its power average climbs. Our benchmark runs its shapes back to back in one
process, so its windows run at the 700 W power cap (about 1600-1750 MHz on the H200 under
attention: scripts/clock-probe.sh). The ratio then compares clocks as much as kernels
(docs/benchmarks.md, "The power state of a measurement").

Here per_call_ms is the peer's own, unchanged, behind one untimed call (the plan is built there)
and a warm-up of --warmup seconds (default 1.0: the H200 settles at its power cap within about
half a second of load), the same warm-up `stableflash bench attention --warmup` is given.

  python3 scripts/peer_timing.py --peers .peers --warmup 1.0 -- attention --B 16 --H 12 --T 1024 --D 64 --causal
      runs torch_peers.py's own command line (its main()) under this timing
  import peer_timing; peer_timing.install(torch_peers, 1.0)   (scripts/attention-sweep.sh's peer process)
  peer_timing.steady(per_call_ms, 1.0)                        (scripts/gqa_sdpa_peer.py)
"""
import argparse, os, sys

DEFAULT_WARMUP_S = 1.0


def steady(per_call_ms, warmup_s=DEFAULT_WARMUP_S):
    """per_call_ms (torch_peers.py's) behind one untimed call, with warmup_s of warm-up."""
    import torch

    def timed(fn, warmup_s=warmup_s, windows=7, min_window_ms=20.0):
        fn()  # cuDNN builds its plan here; the peer's warm-up then is all load
        torch.cuda.synchronize()
        return per_call_ms(fn, warmup_s=warmup_s, windows=windows, min_window_ms=min_window_ms)

    timed.peer_per_call_ms = per_call_ms
    return timed


def install(torch_peers, warmup_s=DEFAULT_WARMUP_S):
    """torch_peers' attention mode looks per_call_ms up in its module at each call: replace it there (once)."""
    original = getattr(torch_peers.per_call_ms, "peer_per_call_ms", torch_peers.per_call_ms)
    torch_peers.per_call_ms = steady(original, warmup_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default=os.environ.get("STABLEFLASH_PEERS", ".peers"), help="folder holding torch_peers.py")
    ap.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, help="seconds of warm-up after the untimed first call")
    ap.add_argument("peer_args", nargs=argparse.REMAINDER, help="-- then torch_peers.py's own arguments")
    a = ap.parse_args()
    args = a.peer_args[1:] if a.peer_args[:1] == ["--"] else a.peer_args
    if not args:
        sys.exit("peer_timing.py: give torch_peers.py's arguments after --")
    if a.warmup < 0:
        sys.exit(f"peer_timing.py: --warmup must be >= 0 seconds (got {a.warmup})")
    sys.path.insert(0, a.peers)
    import torch_peers

    install(torch_peers, a.warmup)
    sys.argv = ["torch_peers.py"] + args
    torch_peers.main()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Our attention and SDPA's backends timed in one process, window by window in turn.

Two processes timed one after the other (`stableflash bench attention`, then torch_peers.py) run in
different power states: on the H200 every attention shape of some size runs at the 700 W power cap,
where the SM clock (1500-1750 MHz under attention, 1980 at most) follows the power average, the
temperature and what ran the second before (scripts/clock-probe.sh; docs/benchmarks.md, "The power
state of a measurement"); the same command's ratios moved by up to 5% between two runs. Here every
implementation of a shape gets the same history: one untimed call each (cuDNN builds its plan),
--warmup seconds of calls in turn, then windows of back-to-back calls (>= --window-ms) in an order in
which every implementation follows every implementation, itself included, equally often
(scripts/balanced_order.py), --windows of each (rounded up to whole cycles). Per implementation and
pass: the median window (its per-call time), and the windows themselves in the JSON, in the order
they ran, so a reader can see the spread.

What this measures: at the power cap the SM clock follows the power drawn over about the last
second, and ours draws more than cuDNN (~690 W against ~530 W at 16x12x1024x64: scripts/clock-probe.sh).
With short windows in a balanced order every implementation runs in the same mixture's power state,
as kernels do inside a training step: the ratio is the kernels' at equal clocks. It is not each
kernel's speed alone at steady load (the C++ bench beside peer_timing.py: each implementation
sustained for a second first), where ours runs at a lower clock than cuDNN. Measured 2026-12-04
(docs/benchmarks.md, "The power state of a measurement"): a fixed cyclic order favoured whatever
followed FA2 by up to 6%; an untimed settling window of 150 ms before each timed one (--settle-ms)
left ours' windows varying by +-6% with how much of the preceding second was ours, while cuDNN's and
FA2's stayed within 1%.

Ours runs through the PyTorch op (stableflash.torch.attention, the wheel of scripts/build-wheel.sh),
the peers through F.scaled_dot_product_attention under torch_peers.py's backend table, all on the same
q, k, v, dO ([B, H, T, D], random normal). The forward is the training forward (grad mode on: ours
writes lse and the residual the compensated δ reads, cuDNN its softmax statistics; torch_peers.py
times an inference forward under no_grad); the backward is autograd.grad of a retained graph, as in
torch_peers.py. FLOPs as there: forward 4·B·H·T²·D, halved when causal; backward 2.5x.

--graphs times the GPU's work without the host's: per implementation one CUDA graph holding n
forward calls and one holding a forward and n backward calls (autograd.grad, captured on the
capture stream as torch.cuda.make_graphed_callables does), a window replaying its graph; the
backward's per-call time is (window - one forward) / n. At short sequences (T <= 384, a few µs of
GPU work a call) eager calls measure Python and autograd, ours (a Python autograd.Function) more
than SDPA (C++ autograd); the graphs measure what the kernels cost, as a trainer with a CUDA-graphed
step sees it.

  PYTHONPATH=<wheel target> python3 scripts/attention-interleaved.py --peers .peers \\
      --shapes 32x16x2048x128:full,16x12x1024x64:causal [--deltas compensated,rounded] [--policy standard] \\
      [--backends cudnn,flash] [--warmup 1.0] [--windows 12] [--window-ms 30] [--settle-ms 0] [--graphs] \\
      [--json OUT.jsonl]

Prints a line per shape; --json gets one object per implementation and shape, in the records of
scripts/attention-sweep.sh ("impl": stableflash | cudnn | flash, fwd/bwd ms and TFLOP/s).
"""
import argparse, json, math, os, re, sys, time

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from balanced_order import cycles_for, pair_balanced_sequence  # scripts/balanced_order.py


def parse_shapes(text):
    shapes = []
    for s in text.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)(?::(causal|full))?", s.strip())
        if not m:
            sys.exit(f"--shapes: BxHxTxD[:causal|full] separated by commas (got '{s}')")
        b, h, t, d = map(int, m.groups()[:4])
        shapes.append((b, h, t, d, (m.group(5) or "causal") == "causal"))
    return shapes


def interleaved(fns, warmup_s, windows, window_ms, settle_ms):
    """fns: name -> call. Per name, the per-call ms of each of its timed windows, in the order of
    pair_balanced_sequence: every implementation's windows follow every implementation (itself
    included) equally often, so each starts from the same mix of power states. --settle-ms > 0
    puts an untimed window of the same implementation before each timed one."""
    for f in fns.values():  # first calls untimed: plans, module loads, allocations
        f()
    torch.cuda.synchronize()
    t0 = time.time()
    while time.time() - t0 < warmup_s:
        for f in fns.values():
            f()
        torch.cuda.synchronize()
    calls, settle = {}, {}
    for name, f in fns.items():  # a window of each lasts >= window_ms, a settling window >= settle_ms
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); b.synchronize()
        call_ms = max(a.elapsed_time(b), 1e-3)
        calls[name] = max(1, math.ceil(window_ms / call_ms))
        settle[name] = math.ceil(settle_ms / call_ms) if settle_ms > 0 else 0

    def window(name):
        for _ in range(settle[name]):  # untimed: the GPU settles into this implementation's state
            fns[name]()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls[name]):
            fns[name]()
        b.record(); b.synchronize()
        return a.elapsed_time(b) / calls[name]

    names, res = list(fns), {name: [] for name in fns}
    seq = [names[i] for i in pair_balanced_sequence(len(names))]
    window(seq[-1])  # untimed: the sequence is cyclic, its first window follows its last
    for _ in range(cycles_for(windows, len(names))):
        for name in seq:
            res[name].append(window(name))
    return res


def graphed(fns, backward_of=None, per_graph_ms=None):
    """fns: name -> call. Per name, a replay of one CUDA graph of n calls (n sized from one eager
    call so that the graph's work lasts about per_graph_ms, at most 1000 calls) and n. With
    backward_of (name -> the forward whose outputs the backward walks), the graph holds that
    forward and then n of fns' calls on its outputs."""
    replays, counts = {}, {}
    for name, f in fns.items():
        eager = f if backward_of is None else (lambda: f(backward_of[name]()))
        eager()  # untimed: plans, module loads, allocations; the next call's time sizes n
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); eager(); b.record(); b.synchronize()
        n = max(1, min(1000, math.ceil(per_graph_ms / max(a.elapsed_time(b), 1e-3))))
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # one eager call on a side stream first, as PyTorch advises before a capture
            eager()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            if backward_of is None:
                for _ in range(n):
                    f()
            else:
                outs = backward_of[name]()
                for _ in range(n):
                    f(outs)
        replays[name], counts[name] = g.replay, n
        torch.cuda.synchronize()
    return replays, counts


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def timed_graphs(forwards, inputs, d_o, a):
    """Per implementation the per-call ms of each window, forward and backward, from CUDA graphs
    (graphed) replayed in rotating turn (interleaved)."""
    fwd_replays, fwd_n = graphed(forwards, per_graph_ms=a.window_ms / 4)
    fwd_windows = interleaved(fwd_replays, a.warmup, a.windows, a.window_ms, a.settle_ms)
    fwd = {name: [w / fwd_n[name] for w in ws] for name, ws in fwd_windows.items()}
    grad = lambda o: torch.autograd.grad(o, inputs, d_o, retain_graph=True)
    bwd_replays, bwd_n = graphed({name: grad for name in forwards}, backward_of=forwards, per_graph_ms=a.window_ms / 4)
    bwd_windows = interleaved(bwd_replays, a.warmup, a.windows, a.window_ms, a.settle_ms)
    bwd = {name: [(w - median(fwd[name])) / bwd_n[name] for w in ws] for name, ws in bwd_windows.items()}
    return fwd, bwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default=os.environ.get("STABLEFLASH_PEERS", ".peers"), help="folder holding torch_peers.py")
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--policy", default=None, help="our shift policy (default: stableflash.torch.DEFAULTS)")
    ap.add_argument("--deltas", default=None, help="our δ sources, comma-separated (default: the default's)")
    ap.add_argument("--backends", default="cudnn,flash", help="SDPA backends (torch_peers.py's names)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--windows", type=int, default=12, help="timed windows per implementation (rounded up to whole cycles)")
    ap.add_argument("--window-ms", type=float, default=30.0, help="a timed window lasts at least this")
    ap.add_argument("--settle-ms", type=float, default=0.0, help="an untimed window of the same implementation before each timed one (0: none)")
    ap.add_argument("--graphs", action="store_true", help="time CUDA graphs of the calls: the GPU's work without the host's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.windows < 1 or a.window_ms <= 0 or a.warmup < 0 or a.settle_ms < 0:
        sys.exit("--windows >= 1, --window-ms > 0, --warmup >= 0, --settle-ms >= 0")
    sys.path.insert(0, a.peers)
    from torch_peers import BACKENDS, backend_list  # the peer's backend table
    import stableflash.torch as sft

    policy = a.policy or sft.DEFAULTS["policy"]
    deltas = (a.deltas or sft.DEFAULTS["delta_source"]).split(",")
    backends = backend_list(a.backends)
    device = torch.cuda.get_device_name()
    n_impl = len(deltas) + len(backends)
    windows = n_impl * cycles_for(a.windows, n_impl)
    method = (f"interleaved in one process: untimed first calls, {a.warmup:g} s of warm-up in turn, median of {windows} "
              f"windows (>= {a.window_ms:g} ms) each, every implementation after every one equally often"
              + (f", each after an untimed {a.settle_ms:g} ms window of its own" if a.settle_ms > 0 else "")
              + "; training forward" + ("; CUDA graphs of n calls (the GPU's work, no host time)" if a.graphs else "; eager calls"))
    out = open(a.json, "w") if a.json else None
    torch.manual_seed(a.seed)
    for b, h, t, d, causal in parse_shapes(a.shapes):
        q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        d_o = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
        flop = 4.0 * b * h * t * t * d / (2 if causal else 1)

        def ours(delta):
            return lambda: sft.attention(q, k, v, causal=causal, policy=policy, delta_source=delta)

        def sdpa(name):
            def call():
                with sdpa_kernel([BACKENDS[name]]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return call

        forwards = {("stableflash", dl): ours(dl) for dl in deltas}
        forwards.update({(name, None): sdpa(name) for name in backends})
        records, line = [], f"{b},{h},{t},{d} {'causal' if causal else 'full  '}"
        try:
            if a.graphs:
                fwd, bwd = timed_graphs(forwards, (q, k, v), d_o, a)
            else:
                fwd = interleaved(forwards, a.warmup, a.windows, a.window_ms, a.settle_ms)
                outputs = {n: f() for n, f in forwards.items()}  # the graphs the backward walks, retained
                backwards = {n: (lambda o=o: torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True)) for n, o in outputs.items()}
                bwd = interleaved(backwards, a.warmup, a.windows, a.window_ms, a.settle_ms)
        except RuntimeError as e:  # a backend may refuse a shape (or a capture): say so, go on
            print(f"{line}  error: {str(e)[:200]}", file=sys.stderr)
            continue
        for (impl, dl) in forwards:
            f_ms, b_ms = median(fwd[(impl, dl)]), median(bwd[(impl, dl)])
            r = {"impl": impl, "B": b, "H": h, "T": t, "D": d, "causal": causal}
            if impl == "stableflash":
                r.update(Hkv=h, layout="bhtd", numerics="fused", policy=policy, delta_source=dl, deterministic=False,
                         check="not run (interleaved)")
            r.update(fwd_ms=f_ms, bwd_ms=b_ms, fwd_tflops=flop / f_ms / 1e9, bwd_tflops=2.5 * flop / b_ms / 1e9,
                     fwd_window_ms=fwd[(impl, dl)], bwd_window_ms=bwd[(impl, dl)], device=device, method=method)
            records.append(r)
            line += f"  {impl}{'/' + dl if dl else ''} {r['fwd_tflops']:5.0f} {r['bwd_tflops']:5.0f}"
        print(line, flush=True)
        if out:
            out.writelines(json.dumps(r) + "\n" for r in records)
            out.flush()
        del q, k, v, d_o
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

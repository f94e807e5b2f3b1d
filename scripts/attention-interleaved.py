#!/usr/bin/env python3
"""Our attention and SDPA's backends timed in one process, window by window in turn.

Two processes timed one after the other (`stableflash bench attention`, then torch_peers.py) run in
different power states: on the H200 every attention shape of some size runs at the 700 W power cap,
where the SM clock (1500-1750 MHz under attention, 1980 at most) follows the power average, the
temperature and what ran the second before (scripts/clock-probe.sh; docs/benchmarks.md, "The power
state of a measurement"); the same command's ratios moved by up to 5% between two runs. Here every
implementation of a shape gets the same history: one untimed call each (cuDNN builds its plan),
--warmup seconds of calls in turn, then --windows rounds in which each implementation runs one
window of back-to-back calls (>= --window-ms, sized per implementation), the order rotated each
round. Per implementation and pass: the median window (its per-call time), and the windows
themselves in the JSON, so a reader can see the spread.

Ours runs through the PyTorch op (stableflash.torch.attention, the wheel of scripts/build-wheel.sh),
the peers through F.scaled_dot_product_attention under torch_peers.py's backend table, all on the same
q, k, v, dO ([B, H, T, D], random normal). The forward is the training forward (grad mode on: ours
writes lse and the residual the compensated δ reads, cuDNN its softmax statistics; torch_peers.py
times an inference forward under no_grad); the backward is autograd.grad of a retained graph, as in
torch_peers.py. FLOPs as there: forward 4·B·H·T²·D, halved when causal; backward 2.5x.

  PYTHONPATH=<wheel target> python3 scripts/attention-interleaved.py --peers .peers \\
      --shapes 32x16x2048x128:full,16x12x1024x64:causal [--deltas compensated,rounded] [--policy standard] \\
      [--backends cudnn,flash] [--warmup 1.0] [--windows 7] [--window-ms 40] [--json OUT.jsonl]

Prints a line per shape; --json gets one object per implementation and shape, in the records of
scripts/attention-sweep.sh ("impl": stableflash | cudnn | flash, fwd/bwd ms and TFLOP/s).
"""
import argparse, json, math, os, re, sys, time

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel


def parse_shapes(text):
    shapes = []
    for s in text.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)(?::(causal|full))?", s.strip())
        if not m:
            sys.exit(f"--shapes: BxHxTxD[:causal|full] separated by commas (got '{s}')")
        b, h, t, d = map(int, m.groups()[:4])
        shapes.append((b, h, t, d, (m.group(5) or "causal") == "causal"))
    return shapes


def interleaved(fns, warmup_s, windows, window_ms):
    """fns: name -> call. Per name, the per-call ms of each of its windows (one per round)."""
    for f in fns.values():  # first calls untimed: plans, module loads, allocations
        f()
    torch.cuda.synchronize()
    t0 = time.time()
    while time.time() - t0 < warmup_s:
        for f in fns.values():
            f()
        torch.cuda.synchronize()
    calls = {}
    for name, f in fns.items():  # a window of each lasts >= window_ms
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); b.synchronize()
        calls[name] = max(1, math.ceil(window_ms / max(a.elapsed_time(b), 1e-3)))
    names, res = list(fns), {name: [] for name in fns}
    for w in range(windows):
        for name in names[w % len(names):] + names[:w % len(names)]:  # the order rotates round by round
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls[name]):
                fns[name]()
            b.record(); b.synchronize()
            res[name].append(a.elapsed_time(b) / calls[name])
    return res


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default=os.environ.get("STABLEFLASH_PEERS", ".peers"), help="folder holding torch_peers.py")
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--policy", default=None, help="our shift policy (default: stableflash.torch.DEFAULTS)")
    ap.add_argument("--deltas", default=None, help="our δ sources, comma-separated (default: the default's)")
    ap.add_argument("--backends", default="cudnn,flash", help="SDPA backends (torch_peers.py's names)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--windows", type=int, default=7)
    ap.add_argument("--window-ms", type=float, default=40.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.windows < 1 or a.window_ms <= 0 or a.warmup < 0:
        sys.exit("--windows >= 1, --window-ms > 0, --warmup >= 0")
    sys.path.insert(0, a.peers)
    from torch_peers import BACKENDS, backend_list  # the peer's backend table
    import stableflash.torch as sft

    policy = a.policy or sft.DEFAULTS["policy"]
    deltas = (a.deltas or sft.DEFAULTS["delta_source"]).split(",")
    backends = backend_list(a.backends)
    device = torch.cuda.get_device_name()
    method = (f"interleaved in one process: untimed first calls, {a.warmup:g} s of warm-up in turn, median of {a.windows} "
              f"windows (>= {a.window_ms:g} ms) taken in rotating turn; training forward")
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
            fwd = interleaved(forwards, a.warmup, a.windows, a.window_ms)
            outputs = {n: f() for n, f in forwards.items()}  # the graphs the backward walks, retained
            backwards = {n: (lambda o=o: torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True)) for n, o in outputs.items()}
            bwd = interleaved(backwards, a.warmup, a.windows, a.window_ms)
        except RuntimeError as e:  # a backend may refuse a shape: say so, go on
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
        del q, k, v, d_o, outputs, backwards
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The compiled PyTorch GPT-2 peer (shared/peers/torch_peers.py gpt2 --no-bias, unchanged) under
torch.profiler: its GPU kernels summed per name over all steps (8 warm-up + --steps), divided by
the number of steps, largest first. Run on the GPU machine beside scripts/profile-train.sh.

    python3 scripts/profile_peer.py --peers .peers [--steps 5] [--top 40]
"""
import argparse, collections, importlib.util, os, re, sys

p = argparse.ArgumentParser()
p.add_argument("--peers", default=".peers")
p.add_argument("--steps", type=int, default=5)
p.add_argument("--top", type=int, default=40)
a = p.parse_args()
spec = importlib.util.spec_from_file_location("torch_peers", os.path.join(a.peers, "torch_peers.py"))
peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peers)
import torch
from torch.profiler import ProfilerActivity, profile

args = argparse.Namespace(B=16, T=1024, steps=a.steps, seed=0, compile=True, bias=False, backend="flash")
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    peers.gpt2_speed(args)
steps = 8 + 5 * max(1, a.steps // 5)
by = collections.defaultdict(float)
count = collections.Counter()
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        name = re.sub(r"<.*>", "<>", re.sub(r"\(.*$", "", e.name))[:90]
        by[name] += e.time_range.elapsed_us() / 1e3  # ms
        count[name] += 1
total = sum(by.values()) / steps
print(f"peer: {steps} steps, {total:.2f} ms of kernel time per step")
print(f"{'ms/step':>8} {'share':>6} {'n/step':>6}  kernel")
for k, v in sorted(by.items(), key=lambda kv: -kv[1])[: a.top]:
    print(f"{v / steps:8.3f} {100 * v / steps / total:5.1f}% {count[k] / steps:6.1f}  {k}")

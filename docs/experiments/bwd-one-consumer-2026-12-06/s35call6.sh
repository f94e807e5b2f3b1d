#!/usr/bin/env bash
# session 35, call 6: the backward's 64-key CTAs with both consumers on the same keys, dims split
# (bwd64k), against main's kernels (onec2): GPU tests and sanitizers of bwd64k, production A/B on small
# and large grids, dK, dV bytes of small grids against main's, then the kernel lab forcing 64- / 128-key
# CTAs over a grid of small head dim 128 shapes (rounds alternating)
S0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
AB_SHAPES=1x1x8192x128:causal,1x2x4096x128:causal,1x8x1024x128:causal,1x16x512x128:causal,1x1x4096x128:full,1x8x512x128:full,1x16x384x128:full,1x1x8192x128:full,1x8x1024x128:full,8x16x4096x128:causal,2x16x2048x128:full \
  timeout 300 scripts/attention-ab.sh --tests bwd64k onec2 bwd64k > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure" $OUT/ab.txt | head -24
. scripts/device-libs.sh
python3 - $OUT <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(9)
save_file({n: (torch.randn(1, 2, 1000, 128, generator=g) * (2 if n != "do" else 1)).to(torch.bfloat16) for n in ("q", "k", "v", "do")}, f"{sys.argv[1]}/sg-s128.safetensors")
PY
for mask in causal full; do
  opts=(--numerics fused --policy standard --delta-source compensated); [ $mask = causal ] && opts+=(--causal)
  for v in onec2 bwd64k; do (use_device_libraries .ab/$v; timeout 60 .ab/$v/stableflash attention $OUT/sg-s128.safetensors -o $OUT/sg-out-$v.safetensors --device cuda "${opts[@]}" > $OUT/sg-$v.log 2>&1) || echo "attention $v $mask failed"; done
  python3 - $OUT "1,2,1000,128 $mask" <<'PY'
import sys, torch
from safetensors.torch import load_file
a, b = (load_file(f"{sys.argv[1]}/sg-out-{v}.safetensors") for v in ("onec2", "bwd64k"))
def same(x, y): return x.shape == y.shape and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
parts = []
for k in sorted(a):
    s = "same" if same(a[k], b[k]) else f"DIFFERENT (max |diff| {(a[k].float() - b[k].float()).abs().max().item():.3g}, max |x| {a[k].float().abs().max().item():.3g})"
    parts.append(f"{k} {s}")
print(sys.argv[2] + ": " + ", ".join(parts))
PY
done
rm -f $OUT/sg-*.safetensors
use_device_libraries .ab/bwd64k
SH=
for m in full causal; do for s in 1x1x4096 1x8x512 1x16x384 1x1x8192 1x2x4096 1x8x1024 1x16x512 2x16x256 1x12x1024 1x3x4096 2x16x384 1x1x16384 1x2x8192 1x8x2048 1x16x1024; do
  SH="$SH${SH:+,}${s}x128:$m"; done; done
L=.ab/bwd64k/kernel_lab
run() { timeout 60 $L --backward-kernel $1 --shapes "$SH" --policy standard --delta-source compensated --no-check \
          --warmup 0.1 --windows 5 --min-window-ms 10 --json $OUT/lab-$1-$2.jsonl > $OUT/lab-$1-$2.txt 2>&1
        echo "lab $1 round $2 rc $? at $((SECONDS - S0)) s"; }
run wgmma-128k 1; run wgmma-64k 1; run wgmma-64k 2; run wgmma-128k 2
python3 - "$OUT" <<'PY'
import json, sys, collections
out = sys.argv[1]
t = collections.defaultdict(lambda: collections.defaultdict(list))
for k in ("wgmma-128k", "wgmma-64k"):
    for r in (1, 2):
        try:
            for line in open(f"{out}/lab-{k}-{r}.jsonl"):
                j = json.loads(line)
                t[(j["D"], j["causal"], j["B"], j["H"], j["T"])][k].append(j["bwd_tflops"])
        except OSError as e: print(e)
print("D mask B H T items64: 128-key CTAs bwd TF/s (2 rounds) | 64-key | ratio")
for key in sorted(t):
    a, b = t[key]["wgmma-128k"], t[key]["wgmma-64k"]
    items = key[2] * key[3] * -(-key[4] // 64)
    if a and b:
        r = (sum(b) / len(b)) / (sum(a) / len(a))
        print(f"{key[0]:3d} {'causal' if key[1] else 'full  '} {key[2]} {key[3]:2d} {key[4]:5d} {items:4d}: {' '.join(f'{x:6.1f}' for x in a)} | {' '.join(f'{x:6.1f}' for x in b)} | {r:.3f}")
PY
grep -E "^\|" $OUT/attention-ab.md | head -30

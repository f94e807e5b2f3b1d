#!/usr/bin/env bash
# session 35, call 2: the backward's one key consumer on small grids (bwd1c) against main's kernels
# (onec2, ed388d1: main's forward and backward): GPU tests and sanitizers of bwd1c, byte comparisons,
# production A/B on small and large grids, then the kernel lab forcing one / two key consumers over
# a grid of small shapes (rounds alternating), and dK, dV bytes of small grids against main's
S0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
AB_SHAPES=1x1x8192x128:full,1x1x8192x128:causal,1x2x4096x64:full,1x2x4096x64:causal,1x8x1024x64:causal,1x8x1024x128:full,1x16x512x128:full,1x16x512x64:causal,1x4x2048x128:causal,16x12x1024x64:causal,8x16x4096x128:causal,2x16x2048x128:full \
  timeout 330 scripts/attention-ab.sh --tests bwd1c --bits onec2 bwd1c > $OUT/call2-ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "tests|PASSED|FAILED|ERROR SUMMARY|RACECHECK|DIFFERENT|failed|Failure|hang" $OUT/call2-ab.txt | head -20
grep -c "same bytes" $OUT/call2-ab.txt
. scripts/device-libs.sh
# small grids, non-deterministic: dk, dv the same bytes as main's two consumers; dq differs (two 64-key parts)
python3 - $OUT <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(9)
for name, (B, H, T, D) in {"s128": (1, 2, 1000, 128), "s64": (1, 3, 777, 64)}.items():
    save_file({n: (torch.randn(B, H, T, D, generator=g) * (2 if n != "do" else 1)).to(torch.bfloat16) for n in ("q", "k", "v", "do")}, f"{sys.argv[1]}/sg-{name}.safetensors")
PY
for c in "s128 causal" "s128 full" "s64 causal" "s64 full"; do
  read -r input mask <<<"$c"; opts=(--numerics fused --policy standard --delta-source compensated); [ $mask = causal ] && opts+=(--causal)
  for v in onec2 bwd1c; do (use_device_libraries .ab/$v; timeout 60 .ab/$v/stableflash attention $OUT/sg-$input.safetensors -o $OUT/sg-out-$v.safetensors --device cuda "${opts[@]}" > $OUT/sg-$v.log 2>&1) || echo "attention $v $c failed"; done
  python3 - $OUT "$c" <<'PY'
import sys, torch
from safetensors.torch import load_file
a, b = (load_file(f"{sys.argv[1]}/sg-out-{v}.safetensors") for v in ("onec2", "bwd1c"))
def same(x, y): return x.shape == y.shape and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
parts = []
for k in sorted(a):
    s = "same" if same(a[k], b[k]) else f"DIFFERENT (max |diff| {(a[k].float() - b[k].float()).abs().max().item():.3g}, max |x| {a[k].float().abs().max().item():.3g})"
    parts.append(f"{k} {s}")
print(sys.argv[2] + ": " + ", ".join(parts))
PY
done
rm -f $OUT/sg-*.safetensors
use_device_libraries .ab/bwd1c
SH=
for d in 128 64; do for m in full causal; do for s in 1x1x4096 1x8x512 1x16x384 1x1x8192 1x2x4096 1x8x1024 1x16x512 2x16x256 1x12x1024 1x3x4096 2x16x384 1x1x16384 1x2x8192 1x8x2048 1x16x1024; do
  SH="$SH${SH:+,}${s}x${d}:$m"; done; done; done
L=.ab/bwd1c/kernel_lab
run() { timeout 110 $L --backward-kernel $1 --shapes "$SH" --policy standard --delta-source compensated --no-check \
          --warmup 0.1 --windows 5 --min-window-ms 10 --json $OUT/lab-$1-$2.jsonl > $OUT/lab-$1-$2.txt 2>&1
        echo "lab $1 round $2 rc $? at $((SECONDS - S0)) s"; }
run wgmma-2c 1; run wgmma-1c 1; run wgmma-1c 2; run wgmma-2c 2
python3 - "$OUT" <<'PY'
import json, sys, collections
out = sys.argv[1]
t = collections.defaultdict(lambda: collections.defaultdict(list))
for k in ("wgmma-2c", "wgmma-1c"):
    for r in (1, 2):
        try:
            for line in open(f"{out}/lab-{k}-{r}.jsonl"):
                j = json.loads(line)
                t[(j["D"], j["causal"], j["B"], j["H"], j["T"])][k].append(j["bwd_tflops"])
        except OSError as e: print(e)
print("D mask B H T items64: two consumers bwd TF/s (2 rounds) | one | ratio one/two")
for key in sorted(t):
    a, b = t[key]["wgmma-2c"], t[key]["wgmma-1c"]
    items = key[2] * key[3] * -(-key[4] // 64)
    if a and b:
        r = (sum(b) / len(b)) / (sum(a) / len(a))
        print(f"{key[0]:3d} {'causal' if key[1] else 'full  '} {key[2]} {key[3]:2d} {key[4]:5d} {items:4d}: {' '.join(f'{x:6.1f}' for x in a)} | {' '.join(f'{x:6.1f}' for x in b)} | {r:.3f}")
PY
tail -60 $OUT/attention-ab.md 2>/dev/null | grep -E "^\|" | head -40

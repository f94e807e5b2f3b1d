#!/usr/bin/env bash
# session 36, call 3: the rotated backward walk (rot) against main's build (main36 = 24f2c8f): GPU tests
# and sanitizers of rot, bytes (deterministic and one-key-block backward: no rotation there), production
# A/B on full shapes (where it rotates) and two causal controls; then the kernel lab forcing 64- or
# 128-key CTAs on small full grids, rot's (rotated) against main36's (plain walks)
S0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
AB_SHAPES=1x8x16384x128:full,2x16x16384x128:full,2x16x2048x128:full,32x16x2048x128:full,8x16x1000x128:full,2x16x384x128:full,16x12x1024x64:full,2x16x8192x64:full,1x8x4097x128:full,8x16x4096x128:causal,16x12x1024x64:causal \
  timeout 400 scripts/attention-ab.sh --tests rot --bits main36 rot > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
. scripts/device-libs.sh
SH=
for s in 1x1x4096 1x8x512 1x16x384 1x1x8192 1x2x4096 1x8x1024 1x16x512 2x16x256 1x12x1024 2x16x384 1x2x8192 1x8x2048; do SH="$SH${SH:+,}${s}x128:full"; done
run() { (use_device_libraries .ab/$1; timeout 60 .ab/$1/kernel_lab --backward-kernel $2 --shapes "$SH" --policy standard --delta-source compensated --no-check \
          --warmup 0.1 --windows 5 --min-window-ms 10 --json $OUT/lab-$1-$2-$3.jsonl > $OUT/lab-$1-$2-$3.txt 2>&1)
        echo "lab $1 $2 round $3 rc $? at $((SECONDS - S0)) s"; }
run main36 wgmma-64k 1; run rot wgmma-64k 1; run rot wgmma-128k 1; run rot wgmma-128k 2; run rot wgmma-64k 2; run main36 wgmma-64k 2
python3 - "$OUT" <<'PY'
import json, sys, collections
out = sys.argv[1]
t = collections.defaultdict(lambda: collections.defaultdict(list))
for k in ("main36-wgmma-64k", "rot-wgmma-128k", "rot-wgmma-64k"):
    for r in (1, 2):
        try:
            for line in open(f"{out}/lab-{k}-{r}.jsonl"):
                j = json.loads(line)
                t[(j["D"], j["causal"], j["B"], j["H"], j["T"])][k].append(j["bwd_tflops"])
        except OSError as e: print(e)
print("D mask B H T items64: bwd TF/s (2 rounds): main36 64-key | rot 128-key | rot 64-key | rot64/rot128 | rot64/main64")
for key in sorted(t):
    a, b, c = t[key]["main36-wgmma-64k"], t[key]["rot-wgmma-128k"], t[key]["rot-wgmma-64k"]
    items = key[2] * key[3] * -(-key[4] // 64)
    m = lambda x: sum(x) / len(x) if x else float('nan')
    print(f"{key[0]:3d} {'causal' if key[1] else 'full  '} {key[2]} {key[3]:2d} {key[4]:5d} {items:4d}: {' '.join(f'{x:6.1f}' for x in a)} | {' '.join(f'{x:6.1f}' for x in b)} | {' '.join(f'{x:6.1f}' for x in c)} | {m(c)/m(b):.3f} | {m(c)/m(a):.3f}")
PY
echo "done at $((SECONDS - S0)) s"

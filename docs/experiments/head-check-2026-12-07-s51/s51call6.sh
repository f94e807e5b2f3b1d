#!/usr/bin/env bash
# Two or three consumers at the D = 64 shapes below cuDNN's forward (the fiftieth session's sweep) and two
# controls: cuDNN runs GPT-2 causal with two consumer warpgroups (this folder's profile), our plan takes three
# there (ws_consumers_for). The kernel lab's production / wgmma-ws-2c / wgmma-ws-3c forwards, twice in
# opposite orders (scripts/forward-lab.sh). Carry .ab/lab51.tar.xz (scripts/attention-ab.sh pack lab51 at 344ddfa).
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"
export STABLEFLASH_DEVBIN=.ab/lab51
export FORWARD_LAB_SHAPES=16x12x1024x64:causal,16x12x1024x64:full,8x16x1000x64:causal,32x16x2048x64:causal,32x16x2048x64:full,2x16x2048x64:full,2x16x8192x64:full
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/card6.txt"
OUT=$OUT/r1 scripts/forward-lab.sh production wgmma-ws-2c wgmma-ws-3c | tail -12
OUT=$OUT/r2 scripts/forward-lab.sh wgmma-ws-3c wgmma-ws-2c production | tail -12
cp "$OUT/r1/forward-lab.md" "$OUT/forward-lab-r1.md"; cp "$OUT/r2/forward-lab.md" "$OUT/forward-lab-r2.md"; rm -rf "$OUT/r1" "$OUT/r2"

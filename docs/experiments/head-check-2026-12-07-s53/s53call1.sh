#!/usr/bin/env bash
# One call, by card. On an H200: the sweep's D = 128 half (pending call 2 of docs/benchmarks.md, no call since the
# thirty-sixth session got an H200) through the thirty-eighth session's script, on main's kernels (carry
# build-cuda/devbin.tar.xz from `scripts/device-check.sh pack --sweep-only` and .peers). On an H100: the kernel
# lab's first run with the fifty-second session's fix (forward_with derives the tail items and lone-block pairs
# for a forced consumer count): production against wgmma-ws-2c and wgmma-ws-3c at the full-attention D = 64
# shapes, twice in opposite orders (carry .ab/lab52.tar.xz, `scripts/attention-ab.sh pack lab52` at c611149).
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
card=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt")
echo "$card"
if [[ "$card" == *H200* ]]; then
  SWEEP_HEAD_DIMS="${S53_SWEEP:-128}" bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh
else
  export STABLEFLASH_DEVBIN=.ab/lab52
  export FORWARD_LAB_SHAPES=16x12x1024x64:full,32x16x2048x64:full,2x16x2048x64:full,2x16x8192x64:full,1x8x16384x64:full,8x16x1000x64:full
  OUT=$OUT/r1 scripts/forward-lab.sh production wgmma-ws-2c wgmma-ws-3c | tail -10
  OUT=$OUT/r2 scripts/forward-lab.sh wgmma-ws-3c wgmma-ws-2c production | tail -10
  cp "$OUT/r1/forward-lab.md" "$OUT/forward-lab-r1.md"; cp "$OUT/r2/forward-lab.md" "$OUT/forward-lab-r2.md"; rm -rf "$OUT/r1" "$OUT/r2"
fi
echo "all done at $((SECONDS - S0)) s"

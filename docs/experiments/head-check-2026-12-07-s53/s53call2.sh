#!/usr/bin/env bash
# The residual's cost at short rows, where the sweep puts the cure above 3% (2,16,384,128 full: forward +16%,
# backward +5% against the rounded δ in the fifty-second session's third round): (1) every kernel of the
# call timed alone at the GPU's own clock, compensated against rounded δ (kernel_times.sh); (2) the kernel
# lab's forward timeline at 2,16,384,128 full (the tile's end: staging, hand-over, lse). On an H200 first the
# sweep's D = 128 half (pending call 2); on an H100 last the kernel lab's two or three consumers at full-attention
# D = 64 shapes with the fifty-second session's fix. Carry .ab/lab52.tar.xz (and for the sweep build-cuda/devbin.tar.xz, .peers).
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
here=docs/experiments/head-check-2026-12-07-s53
card=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt")
echo "$card"
if [[ "$card" == *H200* && -n "${S53_SWEEP-128}" ]]; then
  SWEEP_HEAD_DIMS="${S53_SWEEP-128}" bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh
fi
KT_SHAPES=${KT_SHAPES:-2x16x384x128:full,8x16x1000x64:causal,16x12x1024x64:causal} timeout 240 bash $here/kernel_times.sh | tee "$OUT/kernel-times.md"
echo "kernel times at $((SECONDS - S0)) s"
( . scripts/device-libs.sh && use_device_libraries .ab/lab52 &&
  timeout 60 .ab/lab52/kernel_lab --forward-timeline --timeline-shapes 2x16x384x128:full,2x16x2048x128:full ) > "$OUT/timeline.md" 2>&1
echo "timeline rc $? at $((SECONDS - S0)) s"; head -40 "$OUT/timeline.md"
if [[ "$card" != *H200* ]]; then  # the lab fix's first run
  export STABLEFLASH_DEVBIN=.ab/lab52
  export FORWARD_LAB_SHAPES=16x12x1024x64:full,32x16x2048x64:full,2x16x2048x64:full,2x16x8192x64:full,1x8x16384x64:full,8x16x1000x64:full
  OUT=$OUT/r1 timeout 120 scripts/forward-lab.sh production wgmma-ws-2c wgmma-ws-3c | tail -9
  OUT=$OUT/r2 timeout 120 scripts/forward-lab.sh wgmma-ws-3c wgmma-ws-2c production | tail -9
  cp "$OUT/r1/forward-lab.md" "$OUT/forward-lab-r1.md"; cp "$OUT/r2/forward-lab.md" "$OUT/forward-lab-r2.md"; rm -rf "$OUT/r1" "$OUT/r2"
fi
echo "all done at $((SECONDS - S0)) s"

#!/usr/bin/env bash
# the whole sweep on one card (the binaries of `scripts/device-check.sh pack --sweep-only`, built-from.txt names
# them; carry build-cuda/devbin.tar.xz and .peers), for
# an H200 (pending call 2 of docs/benchmarks.md; not run yet), interleaved with cuDNN under CUDA graphs,
# the exact δ timed too, both halves by head dim in one call (SWEEP_HEAD_DIMS="64" or "128": one half)
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
[ -d build-cuda/devbin ] || { mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz; } || exit 2
cat build-cuda/devbin/built-from.txt; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for d in ${SWEEP_HEAD_DIMS:-128 64}; do
if [ "$d" = 128 ]; then SH=1x8x4097x128:causal,1x8x16384x128:causal,2x16x384x128:causal,2x16x2048x128:causal,2x16x8192x128:causal,8x16x128x128:causal,8x16x1000x128:causal,8x16x4097x128:causal,32x16x128x128:causal,32x16x2048x128:causal,1x8x4097x128:full,1x8x16384x128:full,2x16x384x128:full,2x16x2048x128:full,2x16x8192x128:full,2x16x16384x128:full,8x16x128x128:full,8x16x1000x128:full,8x16x4097x128:full,32x16x128x128:full,32x16x2048x128:full; else SH=1x8x4097x64:causal,1x8x16384x64:causal,2x16x384x64:causal,2x16x2048x64:causal,2x16x8192x64:causal,2x16x16384x64:causal,8x16x128x64:causal,8x16x1000x64:causal,8x16x4097x64:causal,32x16x128x64:causal,32x16x2048x64:causal,1x8x4097x64:full,1x8x16384x64:full,2x16x384x64:full,2x16x2048x64:full,2x16x8192x64:full,2x16x16384x64:full,8x16x128x64:full,8x16x1000x64:full,8x16x4097x64:full,32x16x128x64:full,32x16x2048x64:full; fi
SWEEP_EXTRA_DELTAS=exact SWEEP_WARMUP=0.5 SWEEP_SHAPES=$SH OUT=$OUT/d$d timeout 285 scripts/attention-sweep.sh --interleaved --graphs > $OUT/sweep-d$d.log 2>&1
echo "sweep d$d rc $? at $((SECONDS - S0)) s"
done
for d in ${SWEEP_HEAD_DIMS:-128 64}; do tail -4 $OUT/sweep-d$d.log; done

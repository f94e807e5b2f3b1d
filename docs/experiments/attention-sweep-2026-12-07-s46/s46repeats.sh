#!/usr/bin/env bash
# Right after s46final.sh on the same machine (its build-cuda/devbin unpacked there): the shapes near
# or below 1.0x cuDNN forward in the forty-fourth session's medians, twice more each, per head dim (the
# four benchmark shapes come along in every run), as that session's repeats/. S46_HALVES=B: the D = 64
# shapes alone (A: D = 128), as it ran in the forty-sixth session.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
[ -d build-cuda/devbin ] || { mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz; } || exit 2
A=1x8x16384x128:full,2x16x384x128:full,2x16x2048x128:full,2x16x8192x128:full,2x16x16384x128:full,32x16x2048x128:full,32x16x2048x128:causal
B=32x16x2048x64:full,8x16x1000x64:causal,32x16x2048x64:causal
for r in 1 2; do
  for half in ${S46_HALVES:-A B}; do
    SWEEP_SHAPES=${!half} SWEEP_WARMUP=0.5 OUT=$OUT/r$r$half timeout 140 scripts/attention-sweep.sh --interleaved --graphs > "$OUT/r$r$half.log" 2>&1
    echo "r$r$half rc $? at $((SECONDS - S0)) s"; grep "sweep summary" "$OUT/r$r$half.log"
  done
done

#!/usr/bin/env bash
# session 37, call 2: forward kernel times at ncu's locked base clock, main37 / early / cuDNN
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
timeout 500 bash .peers/cycles.sh 2x16x2048x128:full,32x16x2048x128:full,2x16x8192x128:full,1x8x16384x128:full,8x16x1000x128:full,8x16x4096x128:causal,2x16x16384x128:causal,16x12x1024x64:full main37 early | tee $OUT/cycles.md
echo "at $((SECONDS - S0)) s"

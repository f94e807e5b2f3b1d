#!/usr/bin/env bash
# session 37, call 4: main's forward against cuDNN's at the locked base clock (cycles), warm L2,
# the sixteen shapes where the H100 sweep had the forward below cuDNN and four above
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
timeout 560 scripts/attention-cycles.sh 2x16x384x128:full,2x16x2048x128:full,2x16x8192x128:full,2x16x16384x128:full,1x8x16384x128:full,32x16x2048x128:full,32x16x2048x128:causal,8x16x4096x128:causal,8x16x4097x128:causal,2x16x16384x128:causal,16x12x1024x64:causal,16x12x1024x64:full,1x8x16384x64:full,2x16x2048x64:full,32x16x2048x64:full,8x16x1000x64:causal,8x16x4097x128:full,2x16x8192x128:causal,2x16x16384x64:full,2x16x8192x64:causal main37
echo "at $((SECONDS - S0)) s"

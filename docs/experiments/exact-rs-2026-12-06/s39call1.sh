#!/usr/bin/env bash
# session 39, call 1: the exact δ pass with Q and dO as register A operands (rsx: branch
# exact-rs-operands) against main (main39, 88324d0): rsx's GPU tests and sanitizers, the bytes
# (forward and backward, both δ sources), the exact δ's forward + backward A/B on the six
# longest-row shapes (below 0.8x cuDNN in the s38 sweep) and three others, and the pass alone at
# the locked clock.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
AB_DELTA=exact AB_SHAPES=2x16x16384x128:causal,1x8x16384x128:full,2x16x8192x128:full,1x8x16384x128:causal,2x16x16384x64:full,1x8x16384x64:full,16x12x1024x64:full,8x16x4096x128:causal,16x12x1024x64:causal \
  timeout 330 scripts/attention-ab.sh --tests rsx --bits main39 rsx > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
cat $OUT/attention-ab.md 2>/dev/null
timeout $((560 - (SECONDS - S0))) scripts/attention-cycles.sh --exact-delta 2x16x16384x128:causal,1x8x16384x64:full,16x12x1024x64:full,8x16x4096x128:causal main39 rsx
echo "cycles at $((SECONDS - S0)) s"

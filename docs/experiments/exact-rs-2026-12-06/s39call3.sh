#!/usr/bin/env bash
# session 39, call 3: the exact δ pass with the next tile's S issued ahead (pipe: branch
# exact-pipelined) against main (main39): pipe's GPU tests and sanitizers, the bytes, the exact δ's
# A/B and the pass at the locked clock; then s39call2.sh's profiles.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
AB_DELTA=exact AB_SHAPES=2x16x16384x128:causal,1x8x16384x128:full,2x16x8192x128:full,1x8x16384x128:causal,2x16x16384x64:full,16x12x1024x64:full,8x16x4096x128:causal,32x16x2048x128:full \
  timeout 300 scripts/attention-ab.sh --tests pipe --bits main39 pipe > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
cat $OUT/attention-ab.md 2>/dev/null
timeout 80 scripts/attention-cycles.sh --exact-delta 2x16x16384x128:causal,1x8x16384x128:full,8x16x4096x128:causal,32x16x2048x128:full main39 pipe
echo "cycles at $((SECONDS - S0)) s"
left=$((570 - (SECONDS - S0))); [ $left -gt 60 ] && timeout $left bash docs/experiments/exact-rs-2026-12-06/s39call2.sh

#!/usr/bin/env bash
# session 37, call 6: the last round as items of 1 or 2 blocks (tail2) against main37: tests (the split
# test now at items of 1 and 2), sanitizers, bytes, A/B, cycles
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
AB_SHAPES=1x8x16384x64:full,2x16x2048x64:full,16x12x1024x64:full,8x16x4097x64:full,32x16x2048x64:full,2x16x8192x64:full,2x16x16384x128:full,16x12x1024x64:causal \
  timeout 300 scripts/attention-ab.sh --tests tail2 --bits main37 tail2 > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
cat $OUT/attention-ab.md 2>/dev/null
timeout 150 scripts/attention-cycles.sh 2x16x2048x64:full,16x12x1024x64:full,8x16x4097x64:full,2x16x8192x64:full,1x8x16384x64:full main37 tail2
echo "at $((SECONDS - S0)) s"

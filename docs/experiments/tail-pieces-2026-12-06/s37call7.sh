#!/usr/bin/env bash
# session 37, call 7: tail items with the lone-block rule (tail3) against main37: tests, sanitizers,
# bytes, a short A/B, cycles
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
AB_SHAPES=2x16x2048x64:full,16x12x1024x64:causal \
  timeout 200 scripts/attention-ab.sh --tests tail3 --bits main37 tail3 > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
cat $OUT/attention-ab.md 2>/dev/null
timeout 170 scripts/attention-cycles.sh 32x16x2048x64:full,16x12x1024x64:full,16x12x1024x64:causal,2x16x2048x64:full,8x16x4097x64:full,2x16x8192x64:full main37 tail3
echo "at $((SECONDS - S0)) s"

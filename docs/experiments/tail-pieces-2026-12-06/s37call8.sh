#!/usr/bin/env bash
# session 37, call 8: tail items with the decode out of line (tail4) against main (v3, bench-only):
# tests, sanitizers, bytes, cycles
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
AB_SHAPES=2x16x2048x64:full timeout 130 scripts/attention-ab.sh --tests tail4 --bits v3 tail4 > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
cat $OUT/attention-ab.md 2>/dev/null
timeout 60 scripts/attention-cycles.sh 16x12x1024x64:full,32x16x2048x64:full,2x16x2048x64:full v3 tail4
echo "at $((SECONDS - S0)) s"

#!/usr/bin/env bash
# session 37, call 5: full attention's last round as 64-row pieces (tail, v3 rebuilt) against main37:
# tests (SplitLastRoundGivesEveryRowItsBitsAlone), sanitizers, bytes (d128tail splits), A/B, cycles
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
AB_SHAPES=1x8x16384x64:full,2x16x16384x128:full,32x16x2048x128:full,2x16x2048x128:full,16x12x1024x64:full,16x12x1024x64:causal,8x16x4096x128:causal,2x16x8192x64:full \
  timeout 330 scripts/attention-ab.sh --tests tail --bits main37 tail > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out|Split" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
cat $OUT/attention-ab.md 2>/dev/null
timeout 200 scripts/attention-cycles.sh 1x8x16384x64:full,2x16x16384x128:full,32x16x2048x128:full,16x12x1024x64:full,16x12x1024x64:causal main37 tail
echo "at $((SECONDS - S0)) s"

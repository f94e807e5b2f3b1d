#!/usr/bin/env bash
# session 36, call 5: full attention's last round as 64-row pieces (tail) against main (final = 61c158d's
# kernels): GPU tests and sanitizers of tail (the new SplitLastRound test among them), bytes, A/B on the
# four sweep shapes it splits and three controls
S0=$SECONDS
AB_SHAPES=1x8x16384x64:full,8x16x4097x64:full,2x16x16384x128:full,32x16x2048x128:full,2x16x2048x128:full,16x12x1024x64:full,16x12x1024x64:causal \
  timeout 400 scripts/attention-ab.sh --tests tail --bits final tail > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|SplitLast" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt

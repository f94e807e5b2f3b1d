#!/usr/bin/env bash
# session 36, call 4: main's final build (walk_order.hpp: the walk's start without the remainder)
# against the measured rotated build (rot): GPU tests and sanitizers, bytes, A/B on full shapes
S0=$SECONDS
AB_SHAPES=1x8x16384x128:full,2x16x384x128:full,2x16x2048x128:full,16x12x1024x64:full,1x8x4097x128:full \
  timeout 400 scripts/attention-ab.sh --tests final --bits rot final > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt

#!/usr/bin/env bash
# session 39, call 4 (pending call 3 of docs/benchmarks.md): main as merged (main40 = 3f14f04: the exact δ
# pass one fence shorter in its D = 128 prologue than the measured pipe build) against main39: GPU tests,
# sanitizers, the bytes, and one exact-δ A/B shape.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
AB_DELTA=exact AB_SHAPES=1x8x16384x128:full timeout 200 scripts/attention-ab.sh --tests main40 --bits main39 main40 > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt; cat $OUT/attention-ab.md 2>/dev/null

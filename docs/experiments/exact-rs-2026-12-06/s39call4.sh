#!/usr/bin/env bash
# session 39, call 4 (pending call 3 of docs/benchmarks.md): main as merged (main40 = 3f14f04: the exact δ
# pass one fence shorter in its D = 128 prologue than the measured pipe build) against main39: GPU tests,
# sanitizers, the bytes, and one exact-δ A/B shape.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
AB_DELTA=exact AB_SHAPES=1x8x16384x128:full timeout 200 scripts/attention-ab.sh --tests main40 --bits main39 main40 > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt; cat $OUT/attention-ab.md 2>/dev/null
# the candidate `ahead64` (branch exact-ahead-d64, bench-only pack): the next S issued ahead at D = 64 too,
# three CTAs an SM instead of four; the pass alone at the locked clock, then the exact backward's A/B
timeout 60 scripts/attention-cycles.sh --exact-delta 2x16x8192x64:full,1x8x16384x64:full,16x12x1024x64:full,2x16x2048x64:causal main40 ahead64
AB_TAG=ahead64 AB_DELTA=exact AB_SHAPES=2x16x8192x64:full,1x8x16384x64:full,16x12x1024x64:full timeout 150 scripts/attention-ab.sh main40 ahead64 > $OUT/ab-ahead64.txt 2>&1
echo "ahead64 rc $? at $((SECONDS - S0)) s"; cat $OUT/attention-ab-ahead64.md 2>/dev/null

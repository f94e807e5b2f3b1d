#!/usr/bin/env bash
# session 40, call 3: the forward's scores in log2 units (branch fwd-log2-units, pack `log2`) against main
# (`main40` = 3f14f04, main's kernels): GPU tests and sanitizers on log2, the bytes (the D = 128 fused
# forward and what reads it are expected to differ, the rest not), the bench's A/B, then the forward
# kernels alone at the locked clock. Carry .ab/main40.tar.xz, .ab/log2.tar.xz, .peers.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
SH=2x16x2048x128:full,32x16x2048x128:full,1x8x16384x128:full,8x16x1000x128:full,8x16x4096x128:causal,2x16x384x128:full,16x12x1024x64:full,16x12x1024x64:causal
AB_SHAPES=$SH timeout 330 scripts/attention-ab.sh --tests log2 --bits main40 log2 > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|timed out" $OUT/ab.txt | head -20
echo "same bytes: $(grep -c 'same bytes' $OUT/ab.txt), differ: $(grep -ci 'differ' $OUT/ab.txt)"; grep -i "differ" $OUT/ab.txt | head -30
cat $OUT/attention-ab.md
timeout 150 scripts/attention-cycles.sh $SH main40 log2 2>&1 | tail -12
echo "done at $((SECONDS - S0)) s"

#!/usr/bin/env bash
# session 37, call 3: output warps (ow) against main37: tests, sanitizers, bytes (d128many: the
# persistent grid's later rounds), A/B; the forward at ncu's base clock; ow's timeline
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
AB_SHAPES=2x16x2048x128:full,32x16x2048x128:full,8x16x1000x128:full,32x16x2048x128:causal,8x16x4096x128:causal,2x16x8192x128:full,2x16x384x128:full,16x12x1024x64:full \
  timeout 330 scripts/attention-ab.sh --tests ow --bits main37 ow > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out|running" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
cat $OUT/attention-ab.md 2>/dev/null
timeout 150 bash .peers/cycles.sh 2x16x2048x128:full,32x16x2048x128:full,8x16x1000x128:full,32x16x2048x128:causal main37 ow | tee $OUT/cycles.md
echo "cycles at $((SECONDS - S0)) s"
( . scripts/device-libs.sh && use_device_libraries .ab/ow && timeout 40 .ab/ow/kernel_lab --forward-timeline --timeline-shapes 2x16x2048x128:full > $OUT/timeline-ow.txt 2>&1 )
sed -n '/| phase/,/median period/p' $OUT/timeline-ow.txt | head -24; echo "at $((SECONDS - S0)) s"

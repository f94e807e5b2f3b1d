#!/usr/bin/env bash
# session 37, call 1: P packed during the softmax into a second set of A fragments at D = 128 (early)
# against main (main37): GPU tests and sanitizers of early, bytes, A/B on D = 128 shapes (+ a D = 64
# control, whose kernels are main's), then the timeline of both on 2x16x2048x128 full
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT
S0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
AB_SHAPES=2x16x2048x128:full,32x16x2048x128:full,2x16x8192x128:full,1x8x16384x128:full,8x16x1000x128:full,2x16x384x128:full,8x16x4096x128:causal,32x16x2048x128:causal,2x16x16384x128:causal,16x12x1024x64:full \
  timeout 470 scripts/attention-ab.sh --tests early --bits main37 early > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
cat $OUT/attention-ab.md 2>/dev/null
for v in main37 early; do
  [ $((SECONDS - S0)) -lt 540 ] || break
  ( . scripts/device-libs.sh && use_device_libraries .ab/$v && timeout 40 .ab/$v/kernel_lab --forward-timeline --timeline-shapes 2x16x2048x128:full > $OUT/timeline-$v.txt 2>&1 )
  echo "timeline $v rc $? at $((SECONDS - S0)) s"; sed -n '/| phase/,/median period/p' $OUT/timeline-$v.txt | head -24
done

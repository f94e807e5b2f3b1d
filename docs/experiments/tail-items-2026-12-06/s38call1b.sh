#!/usr/bin/env bash
# session 38, the first call the day's scarce machines allowed: (1) the last round's tail items with
# their decode out of line (merge38: fwd-tail-items e9fdddc merged into main as 2e100ba, whose forward
# kernels have e9fdddc's SASS) against main (main38, 0791120; its GPU tests' shared helper has not run
# on a GPU yet): tests and sanitizers of both, bytes, forward cycles; (2) the head-dim-128 half of the
# sweep (+ the four benchmark shapes) on main38 with the exact δ timed too (the wheel of 0791120
# carried in build-cuda/wheel), interleaved with cuDNN under CUDA graphs.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
AB_SHAPES=2x16x2048x64:full,16x12x1024x64:full timeout 240 scripts/attention-ab.sh --tests main38,merge38 --bits main38 merge38 > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT|timed out" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
cat $OUT/attention-ab.md 2>/dev/null
timeout 70 scripts/attention-cycles.sh 16x12x1024x64:full,32x16x2048x64:full,2x16x2048x64:full,2x16x8192x64:full main38 merge38
echo "cycles at $((SECONDS - S0)) s"
SH=1x8x4097x128:causal,1x8x16384x128:causal,2x16x384x128:causal,2x16x2048x128:causal,2x16x8192x128:causal,8x16x128x128:causal,8x16x1000x128:causal,8x16x4097x128:causal,32x16x128x128:causal,32x16x2048x128:causal,1x8x4097x128:full,1x8x16384x128:full,2x16x384x128:full,2x16x2048x128:full,2x16x8192x128:full,2x16x16384x128:full,8x16x128x128:full,8x16x1000x128:full,8x16x4097x128:full,32x16x128x128:full,32x16x2048x128:full
left=$((545 - (SECONDS - S0)))
STABLEFLASH_DEVBIN=.ab/main38 SWEEP_EXTRA_DELTAS=exact SWEEP_WARMUP=0.5 SWEEP_SHAPES=$SH OUT=$OUT/d128 timeout $left scripts/attention-sweep.sh --interleaved --graphs > $OUT/sweep-d128.log 2>&1
echo "sweep d128 rc $? at $((SECONDS - S0)) s"
tail -3 $OUT/sweep-d128.log

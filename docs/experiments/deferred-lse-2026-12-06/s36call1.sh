#!/usr/bin/env bash
# session 36, call 1: the deferred lse (dlse: stored while the next tile's first S runs; dlse2: the same
# with step 0 apart from the walk's loop) against main's build (main36 = 24f2c8f): GPU tests and
# sanitizers of main36 and dlse2, bytes, A/B on the default shapes; then the kernel lab's timeline
# of main36 and dlse2 on three shapes
S0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 420 scripts/attention-ab.sh --tests main36,dlse2 --bits main36 dlse2 > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|failed|Failure|DIFFERENT" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt
. scripts/device-libs.sh
for v in main36 dlse2; do
  (use_device_libraries .ab/$v; timeout 90 .ab/$v/kernel_lab --forward-timeline --timeline-shapes 2x16x2048x128:full,32x16x2048x128:causal,16x12x1024x64:causal > $OUT/timeline-$v.txt 2>&1) || echo "timeline $v failed"
done
echo "done at $((SECONDS - S0)) s"

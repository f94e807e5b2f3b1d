#!/usr/bin/env bash
# The rounded / compensated delta formed inside the head dim 64 main backward (branch
# bwd-output-delta-in-main, odim49b: a CTA forms the first blocks of the CTA a wave after it) against
# main (base49), one call: a quick check of the new path's own tests under a short limit (a claim that
# never completes would hang), then odim49b's GPU tests and sanitizers, then both benched alternately
# twice at D = 64 shapes and a D = 128 control, with the compensated and the rounded delta. Carry
# .ab/base49.tar.xz, .ab/odim49b.tar.xz; about 5 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh
unpack_ab_variants base49 odim49b
use_device_libraries .ab/odim49b
run_gtests 90 "$OUT/quick-odim49b.log" .ab/odim49b/attention_gpu_tests \
  --gtest_filter='BackwardGpu.DeltaAloneEqualsTheBackwardsDeltaBitForBit:BackwardGpu.WorkspaceNeedNotBeZero:FusedBackward*' ||
  { echo "quick check failed at $((SECONDS - S0)) s"; exit 1; }
echo "quick check passed at $((SECONDS - S0)) s"
shapes=16x12x1024x64:causal,16x12x1024x64:full,8x16x1000x64:causal,8x16x1000x64:full,2x16x384x64:full,2x16x384x64:causal,32x16x2048x64:causal,2x16x2048x64:full,1x8x16384x64:causal,8x16x1000x128:causal
AB_SHAPES=$shapes AB_TAG=comp scripts/attention-ab.sh --tests odim49b base49 odim49b 2>&1 | tail -34
echo "compensated done at $((SECONDS - S0)) s"
AB_SHAPES=$shapes AB_TAG=rnd AB_DELTA=rounded scripts/attention-ab.sh base49 odim49b 2>&1 | tail -16
echo "all done at $((SECONDS - S0)) s"

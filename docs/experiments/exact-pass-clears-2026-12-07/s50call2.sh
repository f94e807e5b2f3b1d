#!/usr/bin/env bash
# The exact δ pass clearing the main kernel's claims / turn counters itself (branch exact-pass-clears,
# xclear: clear_zero_word_share, as the pass from the output does) instead of a memset launch before
# it, against main (base49), one call: xclear's GPU tests (WorkspaceNeedNotBeZero with two more exact
# δ cases on a 0xff workspace) and sanitizers (memcheck on WorkspaceNeedNotBeZero too), the byte
# comparisons, then the exact backward benched alternately twice at short and long shapes and the
# compensated one at three shapes (its pass's clearing moved into the shared helper).
# Carry .ab/base49.tar.xz, .ab/xclear.tar.xz.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh
unpack_ab_variants base49 xclear
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
variant_tests_and_sanitizers xclear '*Tq1Tk1*'
( use_device_libraries .ab/xclear && timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 .ab/xclear/attention_gpu_tests \
    --gtest_filter='*WorkspaceNeedNotBeZero*' --gtest_brief=1 ) > "$OUT/memcheck-workspace-xclear.log" 2>&1
echo "memcheck (workspace) rc $? at $((SECONDS - S0)) s"; grep -E "SUMMARY|PASSED|FAILED" "$OUT/memcheck-workspace-xclear.log" | tail -3
shapes=2x16x384x128:full,2x16x384x128:causal,2x16x384x64:full,8x16x1000x128:full,8x16x1000x64:causal,16x12x1024x64:causal,16x12x1024x64:full,1x8x16384x128:full,2x16x8192x128:full
AB_SHAPES=$shapes AB_TAG=exact AB_DELTA=exact scripts/attention-ab.sh --bits base49 xclear 2>&1 | grep -E "same bytes|DIFFERENT|failed|^\||status"
echo "exact done at $((SECONDS - S0)) s"
AB_SHAPES=2x16x384x128:full,16x12x1024x64:causal,8x16x1000x128:full AB_TAG=comp scripts/attention-ab.sh base49 xclear 2>&1 | grep -E "^\||status"
echo "all done at $((SECONDS - S0)) s"

#!/usr/bin/env bash
# The two lone-block candidates against main (built in the forty-fourth session, not yet measured;
# README.md here): the forward kernels' times at Nsight Compute's locked clock beside cuDNN's, then
# the pairs build's attention GPU tests and compute-sanitizer memcheck and racecheck on its new test. Carry .ab and
# .peers with .ab/main.tar.xz and .ab/lonelast.tar.xz (`scripts/attention-ab.sh pack NAME --bench-only`)
# and .ab/lonepairs.tar.xz (`scripts/attention-ab.sh pack lonepairs`, for its tests); about 4-6 minutes.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants main lonelast lonepairs
for v in main lonelast lonepairs; do echo "$v: $(tr '\n' ' ' < .ab/$v/built-from.txt)"; done
# GPT-2 full (pairs and the partial-last order), 8,16,1000,64 full (both), 32,16,2048,64 full (partial
# last only: its last tile has two blocks), 8,16,4097,128 full (partial last at D = 128), GPT-2 causal
# (neither: the control)
SH=16x12x1024x64:full,8x16x1000x64:full,32x16x2048x64:full,8x16x4097x128:full,16x12x1024x64:causal
OUT=$OUT/cycles timeout 150 scripts/attention-cycles.sh $SH main lonelast lonepairs >/dev/null 2>&1
echo "cycles rc $? at $((SECONDS - S0)) s"; cat "$OUT/cycles/attention-cycles.md"
( use_device_libraries .ab/lonepairs && timeout 120 .ab/lonepairs/attention_gpu_tests ) > "$OUT/tests-lonepairs.log" 2>&1
echo "tests rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|tests ran|Failure|SKIPPED" "$OUT/tests-lonepairs.log" | tail -8
( use_device_libraries .ab/lonepairs && timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 .ab/lonepairs/attention_gpu_tests \
    --gtest_filter='*PairedLoneBlocks*' ) > "$OUT/memcheck-lonepairs.log" 2>&1
echo "memcheck rc $? at $((SECONDS - S0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck-lonepairs.log" | tail -3
( use_device_libraries .ab/lonepairs && timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 .ab/lonepairs/attention_gpu_tests \
    --gtest_filter='*PairedLoneBlocks*' ) > "$OUT/racecheck-lonepairs.log" 2>&1
echo "racecheck rc $? at $((SECONDS - S0)) s"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/racecheck-lonepairs.log" | tail -3

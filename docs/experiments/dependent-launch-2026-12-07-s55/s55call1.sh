#!/usr/bin/env bash
# The dependent-launch tests again, the test mended (fifty-fifth session): the fifty-fourth's call ran the
# one-key-block case with the library's default delta_source (`rounded`: a δ pass from the output before the
# main kernel), so its plan check failed before any launch on both builds and the case without a pass was never
# run. Now it asks for the exact δ (DeltaPass::in_main). (1) the three tests on the build without the wait
# (pdlold2: expected to fail at one key block) and with it (pdlfix2), memcheck of them on pdlfix2; (2) then
# the fifty-fourth session's pending call 3 (s54call1.sh: the idle-SM δ pass, cand54 against base53).
# Carry .ab/pdlold2.tar.xz and .ab/pdlfix2.tar.xz (attention_gpu_tests and its libraries alone; README.md),
# .ab/base53.tar.xz, .ab/cand54.tar.xz, .peers. About 200 s.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh
mkdir -p "$OUT/pdl2"
for v in pdlold2 pdlfix2; do
  mkdir -p ".ab/$v" && tar -C ".ab/$v" -xJf ".ab/$v.tar.xz" || { echo "cannot unpack .ab/$v.tar.xz"; exit 2; }
  ( use_device_libraries ".ab/$v" && timeout 60 ".ab/$v/attention_gpu_tests" --gtest_filter='DependentLaunch*' ) > "$OUT/pdl2/dependent-launch-$v.log" 2>&1
  echo "$v: dependent-launch tests rc $?"; grep -E "^\[ +(OK|FAILED) +\]|Failure|Which is|dq|dk|dv|lse" "$OUT/pdl2/dependent-launch-$v.log" | head -14
done
( use_device_libraries .ab/pdlfix2 && timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 .ab/pdlfix2/attention_gpu_tests \
    --gtest_filter='DependentLaunch*' --gtest_brief=1 ) > "$OUT/pdl2/memcheck-pdlfix2.log" 2>&1
echo "memcheck rc $? at $((SECONDS - S0)) s"; grep -E "SUMMARY|PASSED|FAILED" "$OUT/pdl2/memcheck-pdlfix2.log" | tail -3
tar -C "$OUT" -czf "$OUT/pdl2.tar.gz" pdl2 && rm -rf "$OUT/pdl2"
echo "=== s54call1.sh at $((SECONDS - S0)) s"
bash docs/experiments/delta-idle-sms-2026-12-07-s54/s54call1.sh

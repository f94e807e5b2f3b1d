#!/usr/bin/env bash
# The main backward's wait before its prologue where no δ pass runs before it (one key block, the exact δ
# inside: DeltaPass::in_main), one call: (1) the new GPU tests (dependent_launch_gpu_test.cu: a kernel that lets
# its dependents start at once and writes dO, or Q, 200 us later) against the build without the wait (pdlold:
# main at 01f64ff with that one line commented out), where the one-key-block case is expected to fail, and with
# it (pdlfix: main at 01f64ff); (2) pdlfix's whole attention GPU suite, memcheck and racecheck with the new
# tests; (3) what the wait costs where it applies, the A/B against main before it (base53) at the T = 128
# shapes of the sweep, the default δ (auto: the exact δ inside the main kernel there). About 200 s.
# Carry .ab/base53.tar.xz, .ab/pdlold.tar.xz, .ab/pdlfix.tar.xz (README.md says how they are built), .peers.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt"
unpack_ab_variants base53 pdlold pdlfix
for v in pdlold pdlfix; do
  ( use_device_libraries ".ab/$v" && timeout 60 ".ab/$v/attention_gpu_tests" --gtest_filter='DependentLaunch*' ) > "$OUT/dependent-launch-$v.log" 2>&1
  echo "$v: dependent-launch tests rc $?"; grep -E "^\[ +(OK|FAILED) +\]|Failure|dq|dk|dv|lse" "$OUT/dependent-launch-$v.log" | head -12
done
AB_TAG=t128 AB_DELTA=auto AB_SHAPES=8x16x128x128:full,32x16x128x64:full,8x16x128x64:causal,2x16x384x128:full timeout 200 \
  scripts/attention-ab.sh base53 pdlfix | tail -10
echo "ab at $((SECONDS - S0)) s"
variant_tests_and_sanitizers pdlfix '*DependentLaunch*'
tar -C "$OUT" -czf "$OUT/pdlfix-tests.tar.gz" tests-pdlfix.log memcheck-pdlfix.log racecheck-pdlfix.log && rm -f "$OUT"/{tests,memcheck,racecheck}-pdlfix.log
echo "all done at $((SECONDS - S0)) s"

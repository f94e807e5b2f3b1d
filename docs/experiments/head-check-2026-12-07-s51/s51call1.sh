#!/usr/bin/env bash
# The fiftieth session's last commit (d9ebd0d: execute_backward's dead memset branch now a logic_error,
# host-side only) on a GPU, one call: main's attention GPU tests and sanitizers at that commit (head51)
# and memcheck on WorkspaceNeedNotBeZero; then, only where the card is an H200 (the sweep pending there
# since the thirty-sixth session; the fiftieth session's H100 sweep is of the same kernels), the sweep's
# halves named by S51_SWEEP (default "128"; "" skips it), through the thirty-eighth session's script.
# Carry .ab/head51.tar.xz (scripts/attention-ab.sh pack head51 --no-lab at d9ebd0d), and for the sweep
# build-cuda/devbin.tar.xz (scripts/device-check.sh pack --sweep-only at d9ebd0d) and .peers.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh
card=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt")
echo "$card"
if [ "${S51_TESTS:-1}" = 1 ]; then
  unpack_ab_variants head51
  variant_tests_and_sanitizers head51 '*Tq1Tk1*'
  ( use_device_libraries .ab/head51 && timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 .ab/head51/attention_gpu_tests \
      --gtest_filter='*WorkspaceNeedNotBeZero*' --gtest_brief=1 ) > "$OUT/memcheck-workspace-head51.log" 2>&1
  echo "memcheck (workspace) rc $? at $((SECONDS - S0)) s"; grep -E "SUMMARY|PASSED|FAILED" "$OUT/memcheck-workspace-head51.log" | tail -3
  tar -C "$OUT" -czf "$OUT/head51-logs.tar.gz" tests-head51.log memcheck-head51.log racecheck-head51.log memcheck-workspace-head51.log &&
    rm -f "$OUT"/{tests,memcheck,racecheck,memcheck-workspace}-head51.log
fi
if [[ "$card" == *H200* && -n "${S51_SWEEP-128}" ]]; then
  SWEEP_HEAD_DIMS="${S51_SWEEP-128}" bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh
else
  echo "no sweep (card: ${card%%,*}; S51_SWEEP='${S51_SWEEP-128}')"
fi
echo "all done at $((SECONDS - S0)) s"

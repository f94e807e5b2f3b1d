#!/usr/bin/env bash
# The GPU check of main at 479c74a (forty-third session): the attention GPU tests, compute-sanitizer
# memcheck and racecheck on small shapes, and the model, optimizer and trainer GPU suites, on the full
# pack (`scripts/device-check.sh pack`, the labs left out for the carry's size; carry
# build-cuda/devbin.tar.xz, .peers). The last such check ran on 01117b9's kernels; since then 739ba72
# changed forward_from_host (host code). And the residual's cost in cycles: the forward at the locked
# clock with the compensated δ (the forward writes the residual) and with the rounded one (it does
# not), beside cuDNN (scripts/attention-cycles.sh --delta).
# S43_SHORT=1 (a short device budget): the cycles first, then the attention GPU tests alone.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
[ -d build-cuda/devbin ] || { mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz; } || exit 2
cat build-cuda/devbin/built-from.txt
cycles() {
  mkdir -p .ab && ln -sfn ../build-cuda/devbin .ab/main
  local d SH=32x16x2048x128:full,2x16x2048x128:full,16x12x1024x64:full
  for d in compensated rounded; do
    OUT=$OUT/cycles-$d timeout 60 scripts/attention-cycles.sh --delta $d $SH main >/dev/null 2>&1
    echo "cycles $d rc $? at $((SECONDS - S0)) s"; cat "$OUT/cycles-$d/attention-cycles.md"
  done
}
check() {
  if [ "${S43_SHORT:-0}" = 1 ]; then
    ( . scripts/device-libs.sh && use_device_libraries build-cuda/devbin &&
      timeout 150 build-cuda/devbin/attention_gpu_tests ) >"$OUT/check.log" 2>&1
  else
    timeout 330 scripts/device-check.sh --skip-bench --skip-audit --skip-peer-values --skip-train-bench --skip-python --skip-dist \
      >"$OUT/check.log" 2>&1
  fi
  echo "check rc $? at $((SECONDS - S0)) s"
  grep -E "tests passed|tests failed|PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|Failure|skipped" "$OUT/check.log" | head -40
  tail -25 "$OUT/check.log"
}
if [ "${S43_SHORT:-0}" = 1 ]; then cycles; check; else check; cycles; fi

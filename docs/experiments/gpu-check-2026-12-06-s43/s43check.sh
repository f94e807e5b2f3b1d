#!/usr/bin/env bash
# The GPU check of main at 479c74a (forty-third session): the attention GPU tests, compute-sanitizer
# memcheck and racecheck on small shapes, and the model, optimizer and trainer GPU suites, on the full
# pack (`scripts/device-check.sh pack`; carry build-cuda/devbin.tar.xz, .peers). The last such check ran
# on 01117b9's kernels; since then 739ba72 changed forward_from_host (host code).
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
[ -d build-cuda/devbin ] || { mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz; } || exit 2
cat build-cuda/devbin/built-from.txt
timeout 540 scripts/device-check.sh --skip-bench --skip-audit --skip-peer-values --skip-train-bench --skip-python --skip-dist \
  >"$OUT/check.log" 2>&1
echo "device-check rc $? at $((SECONDS - S0)) s"
grep -E "tests passed|tests failed|PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|Failure|skipped" "$OUT/check.log" | head -40
tail -25 "$OUT/check.log"

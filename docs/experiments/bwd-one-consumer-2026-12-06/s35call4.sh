#!/usr/bin/env bash
# session 35, call 4: the final build (the backward's one key consumer at head dim 128 on small
# grids): attention GPU tests, memcheck and racecheck on the sanitizers' set, the trainer's GPU suites
S0=$SECONDS
mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz || exit 2
cat build-cuda/devbin/built-from.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=$OUT/check timeout 560 scripts/device-check.sh --skip-bench --skip-audit --skip-peer-values --skip-python --skip-dist --skip-train-bench > $OUT/check.log 2>&1
echo "check rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|exit|tests" $OUT/check.log | head -30; tail -15 $OUT/check.log

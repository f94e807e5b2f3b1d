#!/usr/bin/env bash
# Set-up command 2 of the README: installs dependencies, builds, and runs every CPU test.
# GPU tests carry the ctest label `gpu` and run on the GPU machine (scripts/device-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh -DSTABLEFLASH_CUDA=AUTO   # every target, the CUDA ones where nvcc exists
cd build
ctest --output-on-failure --label-exclude gpu -j "${STABLEFLASH_JOBS:-$(nproc)}" "$@"

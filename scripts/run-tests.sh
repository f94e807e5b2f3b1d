#!/usr/bin/env bash
# Set-up command 2 of the README: installs dependencies, builds, and runs every CPU test.
# GPU tests carry the ctest label `gpu` and run on the GPU machine (scripts/device-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh
cd build
ctest --output-on-failure --label-exclude gpu -j "${STABLEFLASH_JOBS:-$(nproc)}" "$@"

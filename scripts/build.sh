#!/usr/bin/env bash
# Configures and builds stableflash into ./build (Release). `--target NAME` builds only that target
# (and what it links); other arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${STABLEFLASH_JOBS:-$(nproc)}"
target=()
args=()
while (($#)); do
  if [ "$1" = "--target" ]; then
    target=(--target "$2")
    shift 2
  else
    args+=("$1")
    shift
  fi
done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${args[@]}" >/dev/null
cmake --build build -j "$jobs" "${target[@]}"

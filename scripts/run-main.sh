#!/usr/bin/env bash
# Set-up command 1 of the README: installs dependencies, builds the `stableflash` program (nothing
# else: no test suites), prepares the default corpus and runs the main job: `stableflash train` with
# the tiny preset on the default corpus, on the GPU when one is visible, else on the CPU (a few
# minutes on 2 cores). The CUDA kernels are compiled only where a GPU will run them. Extra arguments
# go to `stableflash train` (e.g. --steps 50, --set key=value, --device cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  cuda=AUTO   # a GPU is here: build the kernels where nvcc exists
else
  cuda=OFF    # no GPU: training runs on the CPU, so the kernels would only cost build time
fi
scripts/build.sh -DSTABLEFLASH_CUDA=$cuda --target stableflash
scripts/setup-corpus.sh   # the default training corpus, .deps/corpus/shards (docs/default-corpus.md)
exec ./build/stableflash train "$@"

#!/usr/bin/env bash
# Set-up command 1 of the README: installs dependencies, builds, prepares the default corpus and
# runs the main job: `stableflash train` with the tiny preset on the default corpus (CPU, a few
# minutes on 2 cores). Extra arguments go to `stableflash train` (e.g. --steps 50, --set key=value).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh
# The default corpus (.deps/corpus/shards) is built by the tokenizer pipeline's script. Without
# it, `stableflash train` stops with a message saying how to build it.
if [ -x scripts/setup-corpus.sh ]; then
  scripts/setup-corpus.sh
fi
exec ./build/stableflash train "$@"

#!/usr/bin/env bash
# Set-up command 1 of the README: installs dependencies, builds, prepares the default corpus and
# runs the main job: `stableflash train` with the tiny preset on the default corpus (CPU, a few
# minutes on 2 cores). Extra arguments go to `stableflash train` (e.g. --steps 50, --set key=value).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh
scripts/setup-corpus.sh   # the default training corpus, .deps/corpus/shards (docs/default-corpus.md)
exec ./build/stableflash train "$@"

#!/usr/bin/env bash
# Set-up command 1 of the README: installs dependencies, builds, and runs the main job.
# Until the trainer lands (issue "GPT-2 model ... trainer"), the main job is the bias audit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh
scripts/setup-corpus.sh   # the default training corpus, .deps/corpus/shards (docs/default-corpus.md)
exec ./build/stableflash audit "$@"

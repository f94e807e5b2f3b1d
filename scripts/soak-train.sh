#!/usr/bin/env bash
# The long soak of issue 13: many small trainings killed at random moments (SIGKILL mostly, also
# SIGTERM and SIGINT; seeded) and resumed until they finish, each required to end with the
# uninterrupted run's exact losses, data order and optimizer state, with no temporary files left.
# CI runs 10 such runs (ctest: Robustness.SoakRandomKillsAndResumes...); this runs ROUNDS (default 200).
#   scripts/soak-train.sh [ROUNDS] [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-200}"
build="${2:-build}"
bin="$build/tests/train/train_robustness_tests"
if [[ ! -x "$bin" ]]; then
  echo "soak-train: $bin is missing; build it first: ninja -C $build train_robustness_tests" >&2
  exit 2
fi
STABLEFLASH_SOAK_ROUNDS="$rounds" exec "$bin" --gtest_filter='Robustness.SoakRandomKillsAndResumesEndWithTheUninterruptedLosses'

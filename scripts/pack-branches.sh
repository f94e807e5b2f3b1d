#!/usr/bin/env bash
# Builds and packs several branches for one attention-ab call (no GPU needed): for each NAME:BRANCH,
# checks BRANCH out, rebuilds build-cuda incrementally (the targets attention-ab packs) and packs it
# as .ab/NAME.tar.xz; then checks the branch it started on out again. A kernel header change
# rebuilds the objects that include it (8-10 minutes for the forward's), so order the branches so
# that neighbours differ little.
#
#   scripts/pack-branches.sh main:main tot:fwd-row-totals half:fwd-half-step
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: scripts/pack-branches.sh NAME:BRANCH [NAME:BRANCH ...]" >&2; exit 2; }
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "pack-branches: commit or stash the tracked changes first" >&2; exit 2; }
start=$(git symbolic-ref --quiet --short HEAD || git rev-parse HEAD)
trap 'git checkout -q "$start"' EXIT
for pair in "$@"; do
  name=${pair%%:*} branch=${pair#*:}
  [ -n "$name" ] && [ "$branch" != "$pair" ] || { echo "pack-branches: expected NAME:BRANCH, got '$pair'" >&2; exit 2; }
  git checkout -q "$branch"
  echo "=== $name: $branch at $(git rev-parse --short HEAD) ($(date +%T))"
  ninja -C build-cuda -j2 stableflash attention_gpu_tests kernel_lab | tail -1
  scripts/attention-ab.sh pack "$name"
done

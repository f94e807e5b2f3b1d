#!/usr/bin/env bash
# On a GPU machine with two GPUs: two sets of the failure experiment side by side, one per GPU
# (scripts/experiment-failure.sh), then one archive of their tables and metrics in $OUT (the GPU
# machine returns few files). Arguments: one quoted argument list for experiment-failure.sh per GPU.
# Every set stops after EXPERIMENT_SECONDS (default 240) and the archive holds what finished (the
# tables can be rebuilt from it with scripts/failure-table.py).
# EXPERIMENT_GPUS lists the GPUs to use in turn (default 0 1 2 ...), EXPERIMENT_ARCHIVE the archive's
# name in $OUT (default experiments.tar.xz).
#   EXPERIMENT_SECONDS=300 scripts/device-experiments.sh "--round-bits 2 --seeds '2 3'" "--optimizer muon --seeds 1"
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${STABLEFLASH_DEVBIN:-build-cuda/devbin}
OUT=${OUT:-/tmp/stableflash-experiments}
mkdir -p "$OUT"
[ -d "$BIN" ] || { mkdir -p "$BIN" && tar -C "$BIN" -xJf "$BIN.tar.xz"; }
[ -d .deps/corpus/shards ] || { mkdir -p .deps/corpus && tar -C .deps/corpus -xJf .deps/corpus-pack/shards.tar.xz; }
. scripts/device-libs.sh && use_device_libraries "$BIN"
runs=$(mktemp -d)
read -r -a gpus <<<"${EXPERIMENT_GPUS:-0 1 2 3 4 5 6 7}"
i=0
for args in "$@"; do
  eval "set -- $args"
  gpu=${gpus[$i]}
  # one folder per set: several sets may share a GPU (EXPERIMENT_GPUS="0 1 0 1")
  CUDA_VISIBLE_DEVICES=$gpu STABLEFLASH_BIN=$BIN/stableflash OUT=$runs/set$i-gpu$gpu timeout "${EXPERIMENT_SECONDS:-240}" \
    bash scripts/experiment-failure.sh "$@" >"$runs/set$i-gpu$gpu.log" 2>&1 &
  i=$((i + 1))
done
wait
cat "$runs"/set*.log
# metrics and tables only (checkpoints stay behind)
(cd "$runs" && tar -cf - $(find . -name metrics.jsonl -o -name 'table-*.md' -o -name '*.log' -o -name '*.err') | xz -6 >"$OUT/${EXPERIMENT_ARCHIVE:-experiments.tar.xz}")

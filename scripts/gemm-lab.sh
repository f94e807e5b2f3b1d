#!/usr/bin/env bash
# The GEMM lab on the GPU machine (model/cuda/lab/gemm_lab.cpp, docs/cuda-kernels.md "GEMM lab"):
# cuBLASLt's algorithms for GPT-2's MLP products with and without the GELU epilogues, timed and
# checked, from the packed binaries (`scripts/device-check.sh pack` here copies gemm_lab into
# build-cuda/devbin and build-cuda/devbin.tar.xz). Under a minute on an H200 (estimate).
#
#   GPU machine:  scripts/gemm-lab.sh [gemm_lab flags, e.g. --brief, --only DGELU, --tokens 8192]
#
# Output: the per-algorithm listing and the summary table on stdout and in $OUT/gemm-lab.txt
# (default OUT=/tmp/stableflash-device); exit status 1 if a result is outside its bound.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${STABLEFLASH_DEVBIN:-build-cuda/devbin}
OUT=${OUT:-/tmp/stableflash-device}
mkdir -p "$OUT"
. scripts/device-libs.sh && require_devbin_program "$BIN" gemm_lab && use_device_libraries "$BIN"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
"$BIN"/gemm_lab "$@" 2>&1 | tee "$OUT/gemm-lab.txt"
exit "${PIPESTATUS[0]}"

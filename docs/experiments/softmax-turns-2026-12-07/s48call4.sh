#!/usr/bin/env bash
# The per-instruction profile of turns48 (cuDNN's step order in our kernel) beside cuDNN's forward at
# 2,16,2048,128 full (scripts/profile-attention.sh): with the two loops in the same order, where each
# one's softmax section spends its cycles. Carry .ab/turns48.tar.xz and .peers; about 1 minute.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"
. scripts/device-libs.sh && unpack_ab_variants turns48
STABLEFLASH_DEVBIN=.ab/turns48 scripts/profile-attention.sh 2x16x2048x128:full 2>&1 | tail -60

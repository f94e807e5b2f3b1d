#!/usr/bin/env bash
# The sweep's D = 64 half on the binaries of s47call3.sh (e5574af), so that both halves of this session's
# sweep ran on one build. Carry build-cuda/devbin.tar.xz and .peers; about 4 minutes.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"
SWEEP_HEAD_DIMS=64 bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh

#!/usr/bin/env bash
# Fiftieth session: the whole sweep (pending call 2 of docs/benchmarks.md) on main's binaries
# (`scripts/device-check.sh pack --sweep-only` at c5201cb, the exact pass clearing the counters;
# carry build-cuda/devbin.tar.xz and .peers),
# both halves by head dim, through the thirty-eighth session's script; six files come back
# (each half's table and tarball with the JSONL and plots, and the two logs).
OUT=${OUT:-/tmp/stableflash-device}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt"
bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh

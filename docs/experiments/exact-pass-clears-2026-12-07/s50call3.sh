#!/usr/bin/env bash
# s50call2.sh (the exact pass's clearing against main), its files packed into one archive, then on an
# H200 only the D = 128 half of the sweep on main's binaries (pending call 2 of docs/benchmarks.md).
# Carry .ab/base49.tar.xz, .ab/xclear.tar.xz, build-cuda/devbin.tar.xz, .peers.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT/xclear"; S0=$SECONDS
OUT=$OUT/xclear bash docs/experiments/exact-pass-clears-2026-12-07/s50call2.sh
tar -C "$OUT" -czf "$OUT/xclear.tar.gz" xclear && rm -rf "$OUT/xclear"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card at $((SECONDS - S0)) s"
if [[ "$card" == *H200* ]]; then
  SWEEP_HEAD_DIMS=128 bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh
fi
echo "all done at $((SECONDS - S0)) s"

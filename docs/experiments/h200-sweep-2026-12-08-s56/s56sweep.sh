#!/usr/bin/env bash
# Pending call 2 of docs/benchmarks.md: the whole sweep on an H200, and only there (the H100 sweeps are
# published already): on any other card it says which and stops. Carry build-cuda/devbin.tar.xz (from
# `scripts/device-check.sh pack --sweep-only`) and .peers.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card" | tee "$OUT/card.txt"
case "$card" in
  *H200*) exec bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh ;;
  *) echo "not an H200: the sweep is not run"; exit 0 ;;
esac

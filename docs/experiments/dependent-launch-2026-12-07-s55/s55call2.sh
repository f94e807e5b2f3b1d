#!/usr/bin/env bash
# The sweep's eight T = 128 shapes (one key block: the default δ, auto, is the exact δ inside the main backward,
# which since 01f64ff waits for the kernel before it before reading its inputs) against cuDNN and FA2, three
# rounds, interleaved under CUDA graphs, on main's binaries with the wait (scripts/device-check.sh pack
# --sweep-only at 9c89b79; carry build-cuda/devbin.tar.xz and .peers). About 200 s.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
rm -rf build-cuda/devbin; mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz || exit 2  # never a warm machine's older one
cat build-cuda/devbin/built-from.txt; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
SH=8x16x128x128:causal,32x16x128x128:causal,8x16x128x128:full,32x16x128x128:full,8x16x128x64:causal,32x16x128x64:causal,8x16x128x64:full,32x16x128x64:full
SWEEP_EXTRA_DELTAS=exact SWEEP_WARMUP=0.5 SWEEP_SHAPES=$SH OUT=$OUT/t128 timeout 330 scripts/attention-sweep.sh --interleaved --graphs --rounds 3 > $OUT/sweep-t128.log 2>&1
echo "sweep rc $? at $((SECONDS - S0)) s"; tail -4 $OUT/sweep-t128.log

#!/usr/bin/env bash
# Fifty-second session: shapes issue 12 still lists (the fiftieth session's sweep, one round: forward
# below cuDNN, the cure above 3%, the exact δ below 0.8x) and the four benchmark shapes, three rounds each,
# the table taking each implementation's median: which of the gaps of 1-3% are the single round's spread.
# main's kernels (build-cuda/devbin.tar.xz from `scripts/device-check.sh pack --sweep-only` at d9ebd0d; the
# kernels have not changed since), interleaved with cuDNN under CUDA graphs, the exact δ timed too.
# Carry build-cuda/devbin.tar.xz and .peers. Estimated 220 s (the estimate errs long). Nine shapes (the device
# budget left in the session): the forward's lowest six, two with the exact δ below 0.8x, one with the cure at 3.7%.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
[ -d build-cuda/devbin ] || { mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz; } || exit 2
cat build-cuda/devbin/built-from.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt"
SH=32x16x2048x128:full,2x16x384x128:full,1x8x16384x128:full,2x16x8192x128:full,2x16x2048x128:full
SH=$SH,32x16x2048x64:full,8x16x1000x64:causal,2x16x16384x128:full,1x8x16384x64:full
SWEEP_EXTRA_DELTAS=exact SWEEP_WARMUP=0.5 SWEEP_SHAPES=$SH OUT=$OUT/r3 timeout 420 scripts/attention-sweep.sh --interleaved --graphs --rounds 3 > "$OUT/sweep-r3.log" 2>&1
echo "sweep rc $? at $((SECONDS - S0)) s"
tail -4 "$OUT/sweep-r3.log"

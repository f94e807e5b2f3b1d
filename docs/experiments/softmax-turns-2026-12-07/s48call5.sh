#!/usr/bin/env bash
# hot48 (a measurement build: the warp-specialized kernels with round_bits 7 and the FP32 normalizer
# compiled in, so their code is half as long and the epilogue follows the key loop) against main
# (base48) at Nsight Compute's locked clock and in the bench, alternating twice. Carry
# .ab/base48.tar.xz, .ab/hot48.tar.xz and .peers; about 2 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
scripts/attention-cycles.sh 2x16x2048x128:full,32x16x2048x128:full,2x16x8192x128:full,8x16x1000x128:full,8x16x4096x128:causal base48 hot48 >"$OUT/cycles.log" 2>&1
tail -8 "$OUT/cycles.log"; echo "cycles done at $((SECONDS - S0)) s"
AB_SHAPES=2x16x2048x128:full,32x16x2048x128:full,2x16x8192x128:full,8x16x1000x128:full,32x16x2048x128:causal,8x16x4096x128:causal scripts/attention-ab.sh base48 hot48 2>&1 | tail -16
echo "all done at $((SECONDS - S0)) s"

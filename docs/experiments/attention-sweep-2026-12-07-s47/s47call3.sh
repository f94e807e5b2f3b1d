#!/usr/bin/env bash
# Main with the row sum's explicit rounding (lfix47: OnlineSoftmax::move_shift's __fmul_rn, e5574af)
# against the main before it (base47, main's SASS): the attention GPU tests and sanitizers, the forward's
# bytes (which move where nvcc had contracted l * c + part into one FMA) and its time at two shapes,
# then the sweep's D = 128 half on these binaries (`scripts/device-check.sh pack --sweep-only`).
# Carry .ab/base47.tar.xz, .ab/lfix47.tar.xz (`scripts/attention-ab.sh pack lfix47 --no-lab`),
# build-cuda/devbin.tar.xz and .peers; about 8 minutes.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants base47 lfix47
for v in base47 lfix47; do echo "$v: $(tr '\n' ' ' < .ab/$v/built-from.txt)"; done
variant_tests_and_sanitizers lfix47 "*EveryHeadGetsTheBits*"
SH=2x16x2048x128:full,16x12x1024x64:full
AB_SHAPES=$SH timeout 100 scripts/attention-ab.sh --bits base47 lfix47 > "$OUT/ab.log" 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "same bytes|DIFFERENT|failed" "$OUT/ab.log"; sed -n '/^| shape/,$p' "$OUT/ab.log"
SWEEP_HEAD_DIMS=128 OUT=$OUT/sweep bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh
echo "sweep done at $((SECONDS - S0)) s"
OUT=$OUT/cycles timeout 60 scripts/attention-cycles.sh $SH base47 lfix47 lfix47 base47 >/dev/null 2>&1
echo "cycles rc $? at $((SECONDS - S0)) s"; cat "$OUT/cycles/attention-cycles.md"

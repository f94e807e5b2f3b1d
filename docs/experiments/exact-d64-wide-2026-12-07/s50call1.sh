#!/usr/bin/env bash
# The exact δ pass at head dim 64 on the head dim 128 layout (branch exact-d64-wide, xd64w: two
# warpgroups of 64 rows a CTA sharing 128-key K/V tiles, the copy warpgroup's registers to the
# consumers, the next tile's S issued ahead) against main (base49), one call: the candidate's GPU
# tests and sanitizers (with the exact δ cases of several key tiles), the byte comparisons, the
# exact backward benched alternately twice at D = 64 shapes and a D = 128 control (whose kernel did
# not change), and the pass alone at the locked clock. Carry .ab/base49.tar.xz, .ab/xd64w.tar.xz.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh
unpack_ab_variants base49 xd64w
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
variant_tests_and_sanitizers xd64w '*Tq200Tk333D64*:*DeltaAloneEqualsTheBackwardsDeltaBitForBit*:*DeltaSourcesMatchTheCpu*'
shapes=1x8x16384x64:full,1x8x16384x64:causal,2x16x8192x64:full,2x16x16384x64:causal,8x16x4097x64:full,32x16x2048x64:full,32x16x2048x64:causal,16x12x1024x64:causal,16x12x1024x64:full,8x16x1000x64:causal,2x16x384x64:full,2x16x2048x64:causal,8x16x1000x128:causal
AB_SHAPES=$shapes AB_TAG=exact AB_DELTA=exact scripts/attention-ab.sh --bits base49 xd64w 2>&1 | tail -24
echo "bench done at $((SECONDS - S0)) s"
scripts/attention-cycles.sh --exact-delta 1x8x16384x64:full,2x16x8192x64:full,16x12x1024x64:causal,32x16x2048x64:causal base49 xd64w 2>&1 | tail -8
echo "all done at $((SECONDS - S0)) s"

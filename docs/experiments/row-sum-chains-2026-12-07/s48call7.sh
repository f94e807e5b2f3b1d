#!/usr/bin/env bash
# sums48 (branch fwd-row-sum-chains: the fused forward's row sums in four partial chains a row, key
# n-tile nj into chain nj % 4, then (c0 + c1) + (c2 + c3), instead of one chain in key order) against
# main (base48), timing only (the session's device time left no room for its tests; s48call6.sh on the
# branch is the full call): at Nsight Compute's locked clock beside cuDNN, then the bench alternating
# twice. Carry .ab/base48.tar.xz, .ab/sums48.tar.xz and .peers; about 2 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
scripts/attention-cycles.sh 2x16x2048x128:full,2x16x8192x128:full,16x12x1024x64:causal base48 sums48 >"$OUT/cycles.log" 2>&1
tail -6 "$OUT/cycles.log"; echo "cycles done at $((SECONDS - S0)) s"
AB_SHAPES=2x16x2048x128:full,32x16x2048x128:full,8x16x1000x128:full,16x12x1024x64:full scripts/attention-ab.sh base48 sums48 2>&1 | tail -12
echo "all done at $((SECONDS - S0)) s"

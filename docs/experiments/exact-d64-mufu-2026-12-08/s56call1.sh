#!/usr/bin/env bash
# Head dim 64 with fewer instructions and special-function-pipe exponentials per score (branch
# exact-d64-mufu) against main (base56), one call. p0: the exact δ pass's P in the pow2-scale FMA
# form (one instruction less a score, the same bits). p8b: that, every 8th key n-tile's exponentials
# of the pass by exp2_poly on the FMA pipe past one key block, and the main backward's P in the FMA
# form too (the same bits). p8b's GPU tests and sanitizers; the byte comparisons (p0 must give main's
# bytes everywhere, p8b differs only in the exact δ at D = 64 past one key block); the exact and the
# compensated backward benched alternately twice; the pass and the main backward kernel alone at the
# locked clock; the pass's pipes. Carry .ab/base56.tar.xz .ab/p0.tar.xz .ab/p8b.tar.xz.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh
unpack_ab_variants base56 p0 p8b
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt"
variant_tests_and_sanitizers p8b '*Tq200Tk333D64*:*DeltaAloneEqualsTheBackwardsDeltaBitForBit*:*DeltaSourcesMatchTheCpu*:*Exp2Poly*'
echo "checks done at $((SECONDS - S0)) s"
shapes=1x8x16384x64:full,1x8x16384x64:causal,2x16x8192x64:full,2x16x16384x64:causal,32x16x2048x64:full,16x12x1024x64:causal,8x16x1000x64:causal,2x16x8192x128:full
AB_SHAPES=$shapes AB_TAG=exact AB_DELTA=exact timeout 200 scripts/attention-ab.sh --bits base56 p0 p8b 2>&1 | tail -24
echo "exact bench done at $((SECONDS - S0)) s"
AB_SHAPES=16x12x1024x64:causal,16x12x1024x64:full,8x16x1000x64:causal,32x16x2048x64:full,2x16x8192x64:full AB_TAG=comp AB_DELTA=compensated \
  timeout 100 scripts/attention-ab.sh base56 p8b 2>&1 | tail -9
echo "compensated bench done at $((SECONDS - S0)) s"
timeout 80 scripts/attention-cycles.sh --exact-delta 1x8x16384x64:full,2x16x8192x64:full,16x12x1024x64:causal base56 p0 p8b 2>&1 | tail -4
cp "$OUT/attention-cycles.md" "$OUT/cycles-exact.md"
timeout 60 scripts/attention-cycles.sh --backward 16x12x1024x64:causal,32x16x2048x64:full,1x8x16384x64:full base56 p8b 2>&1 | tail -4
echo "cycles done at $((SECONDS - S0)) s"
# the pass's pipes at one shape (locked clock): special-function (xu), FMA, tensor, issue
m=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,gpu__time_duration.sum
for v in base56 p8b; do
  ( use_device_libraries ".ab/$v" && timeout 40 ncu --csv --metrics $m --launch-skip 2 --launch-count 1 --kernel-name regex:delta_exact_kernel \
      ".ab/$v/stableflash" bench attention --shapes 1x8x16384x64:full --numerics fused --policy standard --delta-source exact \
      --warmup 0 --windows 1 --min-window-ms 1 --no-check 2>/dev/null | grep '^"' | python3 -c '
import csv, sys
for r in csv.DictReader(sys.stdin): print(sys.argv[1], r["Metric Name"], r["Metric Value"])' "$v" ) | tee -a "$OUT/pipes.txt"
done
echo "all done at $((SECONDS - S0)) s"

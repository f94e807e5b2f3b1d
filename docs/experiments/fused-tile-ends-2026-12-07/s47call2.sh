#!/usr/bin/env bash
# The second build (fused47b: the producer issues the next tile's K_0 and each consumer's Q as early as
# it can; the fused tile ends at D = 128 only) against base47, as s47call1.sh: the bench's A/B with
# the byte comparison, the forward at the locked clock beside cuDNN, the lab's timeline of both tile
# ends, fused47b's GPU tests and sanitizers with the multi-round cases. Carry .ab/base47.tar.xz,
# .ab/fused47b.tar.xz (`scripts/attention-ab.sh pack fused47b`) and .peers; about 5 minutes.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants base47 fused47b
for v in base47 fused47b; do echo "$v: $(tr '\n' ' ' < .ab/$v/built-from.txt)"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SH=2x16x2048x128:full,32x16x2048x128:full,8x16x1000x128:full,2x16x8192x128:full,8x16x4096x128:causal,32x16x2048x128:causal,16x12x1024x64:full
AB_SHAPES=$SH timeout 200 scripts/attention-ab.sh --bits base47 fused47b > "$OUT/ab.log" 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -c "same bytes" "$OUT/ab.log"; grep -E "DIFFERENT|failed" "$OUT/ab.log" | head -5; sed -n '/^| shape/,$p' "$OUT/ab.log"
OUT=$OUT/cycles-locked timeout 160 scripts/attention-cycles.sh $SH base47 fused47b fused47b base47 >/dev/null 2>&1
echo "cycles (locked clock) rc $? at $((SECONDS - S0)) s"; cat "$OUT/cycles-locked/attention-cycles.md"
for ends in apart fused; do
  ( use_device_libraries .ab/fused47b && timeout 50 .ab/fused47b/kernel_lab --forward-timeline --timeline-tile-ends $ends \
      --timeline-shapes 2x16x2048x128:full,8x16x1000x128:full ) > "$OUT/timeline-$ends.txt" 2>&1
  echo "timeline $ends rc $? at $((SECONDS - S0)) s"; grep -E "^###|^production|period \(|epilogue \(|next tile's Q|tile span|beyond its steps" "$OUT/timeline-$ends.txt"
done
variant_tests_and_sanitizers fused47b "*EveryHeadGetsTheBits*:*EveryLaunchOfTheTileSchedule*"

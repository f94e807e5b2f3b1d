#!/usr/bin/env bash
# The warp-specialized forward's tile end fused with the next tile's first step (fused47, branch
# fwd-fused-tile-ends) against the same tree with the fusion off (base47: main's kernels, SASS
# identical): the bench's A/B with the byte comparison, the forward's time at the locked clock beside
# cuDNN's, the lab's timeline of both tile ends (one lab binary), then fused47's attention GPU tests,
# memcheck and racecheck with the multi-round cases that take the fused path. Carry .ab/base47.tar.xz
# (`scripts/attention-ab.sh pack base47 --bench-only`), .ab/fused47.tar.xz (`pack fused47`) and .peers;
# about 7 minutes.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants base47 fused47
for v in base47 fused47; do echo "$v: $(tr '\n' ' ' < .ab/$v/built-from.txt)"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SH=2x16x2048x128:full,32x16x2048x128:full,8x16x1000x128:full,2x16x8192x128:full,8x16x4096x128:causal,16x12x1024x64:full,32x16x2048x64:full,16x12x1024x64:causal
AB_SHAPES=$SH timeout 220 scripts/attention-ab.sh --bits base47 fused47 > "$OUT/ab.log" 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -c "same bytes" "$OUT/ab.log"; grep -E "differ|failed" "$OUT/ab.log" | head -5; sed -n '/^| shape/,$p' "$OUT/ab.log"
OUT=$OUT/cycles-locked timeout 170 scripts/attention-cycles.sh $SH base47 fused47 fused47 base47 >/dev/null 2>&1
echo "cycles (locked clock) rc $? at $((SECONDS - S0)) s"; cat "$OUT/cycles-locked/attention-cycles.md"
for ends in apart fused; do
  ( use_device_libraries .ab/fused47 && timeout 60 .ab/fused47/kernel_lab --forward-timeline --timeline-tile-ends $ends \
      --timeline-shapes 2x16x2048x128:full,8x16x1000x128:full,16x12x1024x64:full ) > "$OUT/timeline-$ends.txt" 2>&1
  echo "timeline $ends rc $? at $((SECONDS - S0)) s"; grep -E "^###|^production|period \(|epilogue \(|tile span|beyond its steps" "$OUT/timeline-$ends.txt"
done
variant_tests_and_sanitizers fused47 "*EveryHeadGetsTheBits*:*EveryLaunchOfTheTileSchedule*"

#!/usr/bin/env bash
# session 34, call 4: fwd-one-consumer's final rule (onec2) against main's kernels (halfd64): GPU tests,
# sanitizers, byte comparisons (main's and small grids'), production A/B
S0=$SECONDS
AB_SHAPES=1x1x8192x128:full,1x1x8192x128:causal,1x2x4096x64:full,1x8x1024x64:causal,1x8x2048x128:causal,1x8x2048x64:causal,1x8x2048x128:full,2x16x384x128:causal,1x16x512x128:full,16x12x1024x64:causal \
  timeout 400 scripts/attention-ab.sh --tests onec2 --bits halfd64 onec2 > $OUT/call4-ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "tests|PASSED|FAILED|ERROR SUMMARY|RACECHECK|DIFFERENT|failed" $OUT/call4-ab.txt | head -20
grep -c "same bytes" $OUT/call4-ab.txt
. scripts/device-libs.sh && use_device_libraries .ab/onec2
python3 - $OUT <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(8)
for name, (B, H, T, D) in {"s128": (1, 8, 1000, 128), "s64": (1, 1, 4000, 64), "c128": (1, 8, 2048, 128), "c64": (1, 8, 1500, 64)}.items():
    save_file({n: (torch.randn(B, H, T, D, generator=g) * 2).to(torch.bfloat16) for n in ("q", "k", "v")}, f"{sys.argv[1]}/sg-{name}.safetensors")
PY
for c in "s128 full" "s64 full" "c128 causal" "c64 causal"; do
  read -r input mask <<<"$c"; opts=(--numerics fused --policy standard --delta-source compensated); [ $mask = causal ] && opts+=(--causal)
  for v in halfd64 onec2; do timeout 60 .ab/$v/stableflash attention $OUT/sg-$input.safetensors -o $OUT/sg-out-$v.safetensors --device cuda "${opts[@]}" > $OUT/sg-$v.log 2>&1 || echo "attention $v $c failed"; done
  cmp -s $OUT/sg-out-halfd64.safetensors $OUT/sg-out-onec2.safetensors && echo "small grid same bytes: $c" || echo "small grid DIFFERENT: $c"
done
rm -f $OUT/sg-*
tail -24 $OUT/attention-ab.md

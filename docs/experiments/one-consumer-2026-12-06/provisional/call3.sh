#!/usr/bin/env bash
# session 34, call 3: the one-consumer build (onec = fwd-one-consumer) against main's kernels (halfd64 =
# 76c79d9, kernels identical to main's): GPU tests, sanitizers, byte comparisons, production A/B on
# small grids, then the kernel lab (forced one consumer, the one-warpgroup kernel) on the same grid,
# and small-grid byte comparisons (one consumer against two / three)
S0=$SECONDS
SH=
for d in 128 64; do for m in full causal; do for s in 1x8x256 1x16x384 1x8x512 1x16x512 2x16x256 1x8x1024 1x4x2048 1x2x4096 1x1x8192 2x16x384 1x8x2048; do
  SH="$SH${SH:+,}${s}x${d}:$m"; done; done; done
AB_SHAPES=$SH timeout 420 scripts/attention-ab.sh --tests onec --bits halfd64 onec > $OUT/call3-ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "tests|PASSED|FAILED|ERROR SUMMARY|RACECHECK|DIFFERENT|failed" $OUT/call3-ab.txt | head -20
grep -c "same bytes" $OUT/call3-ab.txt
. scripts/device-libs.sh && use_device_libraries .ab/onec
L=.ab/onec/kernel_lab
run() { timeout 100 $L --forward-kernel $1 --shapes "$SH" --policy standard --delta-source compensated --no-check \
          --warmup 0.1 --windows 5 --min-window-ms 10 --json $OUT/lab-$1-$2.jsonl > $OUT/lab-$1-$2.txt 2>&1
        echo "lab $1 round $2 rc $? at $((SECONDS - S0)) s"; }
run wgmma-ws-1c 1; run wgmma-1wg 1; run wgmma-1wg 2; run wgmma-ws-1c 2
# bits: small grids, onec's plan (one consumer) against main's (two / three consumers)
python3 - $OUT <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(7)
for name, (B, H, T, D) in {"s128": (1, 8, 1000, 128), "s64": (1, 8, 1000, 64), "c128": (1, 8, 500, 128)}.items():
    save_file({n: (torch.randn(B, H, T, D, generator=g) * 2).to(torch.bfloat16) for n in ("q", "k", "v")}, f"{sys.argv[1]}/sg-{name}.safetensors")
PY
for c in "s128 full" "s64 full" "c128 causal"; do
  read -r input mask <<<"$c"; opts=(--numerics fused --policy standard --delta-source compensated); [ $mask = causal ] && opts+=(--causal)
  for v in halfd64 onec; do timeout 60 .ab/$v/stableflash attention $OUT/sg-$input.safetensors -o $OUT/sg-out-$v.safetensors --device cuda "${opts[@]}" > $OUT/sg-$v.log 2>&1 || echo "attention $v $c failed"; done
  cmp -s $OUT/sg-out-halfd64.safetensors $OUT/sg-out-onec.safetensors && echo "small grid same bytes: $c" || echo "small grid DIFFERENT: $c"
done
rm -f $OUT/sg-*.safetensors
python3 - $OUT <<'PY'
import json, sys, collections, glob, re
out = sys.argv[1]
t = collections.defaultdict(lambda: collections.defaultdict(list))
def add(path, key):
    for line in open(path):
        j = json.loads(line); t[(j["D"], j["causal"], j["B"], j["H"], j["T"])][key].append(j["fwd_tflops"])
for k in ("wgmma-ws-1c", "wgmma-1wg"):
    for r in (1, 2): add(f"{out}/lab-{k}-{r}.jsonl", k)
# the A/B's bench tables: ab-NAME-ROUND.txt inside ab-logs.tar.gz are not JSON; print the table of $OUT/attention-ab.md instead
print(open(f"{out}/attention-ab.md").read()[-9000:] if glob.glob(f"{out}/attention-ab.md") else "no table in $OUT")
print("D causal B H T: lab ws-1c forced | 1wg (fwd TF/s, two rounds)")
for key in sorted(t):
    a, b = t[key]["wgmma-ws-1c"], t[key]["wgmma-1wg"]
    print(key, " ".join(f"{x:.1f}" for x in a), "|", " ".join(f"{x:.1f}" for x in b))
PY

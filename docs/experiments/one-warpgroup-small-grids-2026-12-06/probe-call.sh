#!/usr/bin/env bash
# session 34, call 1: merged main's D = 64 causal sweep beside cuDNN, the one-warpgroup forward against
# production at D = 128 shapes of under one round, then GPU tests and sanitizers on the merged build
S0=$SECONDS
mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz || exit 2
cat build-cuda/devbin/built-from.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SWEEP_WARMUP=0.5 SWEEP_SHAPES=1x8x4097x64:causal,1x8x16384x64:causal,2x16x384x64:causal,2x16x2048x64:causal,2x16x8192x64:causal,2x16x16384x64:causal,8x16x128x64:causal,8x16x1000x64:causal,8x16x4097x64:causal,32x16x128x64:causal,32x16x2048x64:causal \
  timeout 240 scripts/attention-sweep.sh --interleaved --graphs > $OUT/sweep.log 2>&1; echo "sweep rc $? at $((SECONDS - S0)) s"
tail -16 $OUT/sweep.log
L=build-cuda/devbin/kernel_lab
SH=2x16x384x128:full,2x16x384x128:causal,2x16x256x128:full,1x16x512x128:full,1x8x1024x128:full,4x16x384x128:full
for r in 1 2; do
  for k in production wgmma-1wg; do
    [ $r = 2 ] && [ $k = production ] && continue
    timeout 90 $L --forward-kernel $k --shapes $SH --policy standard --delta-source compensated,rounded --no-check > $OUT/lab-$k-$r.txt 2>&1
    echo "lab $k round $r rc $? at $((SECONDS - S0)) s"
  done
  [ $r = 2 ] && timeout 90 $L --forward-kernel production --shapes $SH --policy standard --delta-source compensated,rounded --no-check > $OUT/lab-production-2.txt 2>&1
done
for f in $OUT/lab-*.txt; do echo "== $f"; grep -v '^\s*$' $f | tail -14; done
mkdir -p $OUT/check
OUT=$OUT/check timeout $((585 - SECONDS)) scripts/device-check.sh --skip-bench --skip-audit --skip-peer-values --skip-train --skip-python --skip-dist > $OUT/check.log 2>&1
echo "check rc $? at $((SECONDS - S0)) s"; tail -25 $OUT/check.log

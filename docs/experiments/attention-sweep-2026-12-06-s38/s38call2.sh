#!/usr/bin/env bash
# session 38, call 2 (the machine still warm after tail-items-2026-12-06/s38call1b.sh, which ran the
# head-dim-128 half): the head-dim-64 half of the sweep on main38 (0791120), the exact δ timed too
OUT=${OUT:-/tmp/stableflash-device}
SH=1x8x4097x64:causal,1x8x16384x64:causal,2x16x384x64:causal,2x16x2048x64:causal,2x16x8192x64:causal,2x16x16384x64:causal,8x16x128x64:causal,8x16x1000x64:causal,8x16x4097x64:causal,32x16x128x64:causal,32x16x2048x64:causal,1x8x4097x64:full,1x8x16384x64:full,2x16x384x64:full,2x16x2048x64:full,2x16x8192x64:full,2x16x16384x64:full,8x16x128x64:full,8x16x1000x64:full,8x16x4097x64:full,32x16x128x64:full,32x16x2048x64:full
STABLEFLASH_DEVBIN=.ab/main38 SWEEP_EXTRA_DELTAS=exact SWEEP_WARMUP=0.5 SWEEP_SHAPES=$SH OUT=$OUT/d64 timeout 300 scripts/attention-sweep.sh --interleaved --graphs > $OUT/sweep-d64.log 2>&1
echo "sweep d64 rc $?"; tail -3 $OUT/sweep-d64.log

#!/usr/bin/env bash
# The D = 128 forward with cuDNN's step order (turns48: softmax in turns, no product in flight across
# it; forward_turn_walk) against main (base48), one call: the GPU tests and sanitizers on turns48, the
# outputs byte for byte against base48, both benched alternately twice (forward and backward TFLOP/s),
# and both beside cuDNN at Nsight Compute's locked clock. Carry .ab/base48.tar.xz, .ab/turns48.tar.xz and
# .peers; about 5 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
shapes=2x16x2048x128:full,32x16x2048x128:full,2x16x8192x128:full,8x16x1000x128:full,2x16x384x128:full,1x8x16384x128:full,32x16x2048x128:causal,8x16x4096x128:causal,2x16x16384x128:causal
scripts/attention-cycles.sh 2x16x2048x128:full,32x16x2048x128:full,2x16x8192x128:full,8x16x4096x128:causal base48 turns48 >"$OUT/cycles.log" 2>&1
cp "$OUT/attention-cycles.md" "$OUT/cycles-locked.md" 2>/dev/null; tail -12 "$OUT/cycles.log"
echo "cycles done at $((SECONDS - S0)) s"
AB_SHAPES=$shapes scripts/attention-ab.sh --tests turns48 --bits base48 turns48 2>&1 | tail -45
echo "all done at $((SECONDS - S0)) s"

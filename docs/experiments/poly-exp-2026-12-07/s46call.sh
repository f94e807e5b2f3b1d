#!/usr/bin/env bash
# A share of the fused forward's exponentials on the FMA pipe (exp2_poly) against main: every 4th
# (poly4: the build's tests and sanitizers too), 8th (poly8) or 2nd (poly2) key n-tile's. The
# forward's time at the locked clock and at the real one beside cuDNN's, then poly4's attention GPU
# tests (the new Exp2PolyGivesTheHostsBits among them), memcheck and racecheck on the small cases.
# Carry .ab (main.tar.xz = 3bed68c's stableflash, poly4 --no-lab, poly8 and poly2 --bench-only) and
# .peers; about 5 minutes. (Its last lines, as run, spelt out what variant_tests_and_sanitizers in
# scripts/device-libs.sh now runs: the same commands.)
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants main poly4 poly8 poly2
for v in main poly4 poly8 poly2; do echo "$v: $(tr '\n' ' ' < .ab/$v/built-from.txt)"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SH=16x12x1024x64:full,16x12x1024x64:causal,32x16x2048x64:full,2x16x8192x64:full,2x16x2048x128:full,2x16x8192x128:full,8x16x4096x128:causal
for clock in locked real; do
  flag=$([ $clock = real ] && echo --real-clock)
  OUT=$OUT/cycles-$clock timeout 200 scripts/attention-cycles.sh $flag $SH main poly4 poly8 poly2 main >/dev/null 2>&1
  echo "cycles ($clock clock) rc $? at $((SECONDS - S0)) s"; cat "$OUT/cycles-$clock/attention-cycles.md"
done
variant_tests_and_sanitizers poly4 "*Exp2Poly*"

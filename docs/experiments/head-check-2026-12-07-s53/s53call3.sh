#!/usr/bin/env bash
# The δ pass on the SMs the main kernel leaves idle (BackwardPlan::delta_ctas, this session's candidate cand53)
# against main (base53 = stableflash of c611149, from .ab/lab52.tar.xz without the lab and the tests), one call:
# (1) the candidate's attention GPU tests, memcheck and racecheck (with DeltaAloneEqualsTheBackwardsDeltaBitForBit,
# whose backwards take the idle-SM pass at its small grids and whose attention_delta calls the spread one);
# (2) attention-ab.sh --bits (forward and backward bytes against main) and the A/B at the two 2,16,384 full shapes
# (96 CTAs, 36 SMs idle) and a control, compensated then rounded δ; (3) each kernel of the call alone at the
# GPU's clock (kernel_times.sh), both builds, 2,16,384,128 full, both δ sources.
# Carry .ab/base53.tar.xz and .ab/cand53.tar.xz (scripts/attention-ab.sh pack cand53 --no-lab).
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
here=docs/experiments/head-check-2026-12-07-s53
. scripts/device-libs.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt"
unpack_ab_variants base53 cand53
variant_tests_and_sanitizers cand53 '*DeltaAlone*:*Subnormal*'
tar -C "$OUT" -czf "$OUT/cand53-tests.tar.gz" tests-cand53.log memcheck-cand53.log racecheck-cand53.log && rm -f "$OUT"/{tests,memcheck,racecheck}-cand53.log
AB_TAG=comp AB_DELTA=compensated AB_SHAPES=2x16x384x128:full,2x16x384x64:full,16x12x1024x64:full timeout 240 \
  scripts/attention-ab.sh --bits base53 cand53 | tail -16
echo "ab comp at $((SECONDS - S0)) s"
AB_TAG=rnd AB_DELTA=rounded AB_SHAPES=2x16x384x128:full,2x16x384x64:full timeout 120 scripts/attention-ab.sh base53 cand53 | tail -6
echo "ab rnd at $((SECONDS - S0)) s"
for v in base53 cand53; do
  KT_BIN=.ab/$v KT_SHAPES=2x16x384x128:full timeout 90 bash $here/kernel_times.sh | sed "s/^| 2x16/| $v 2x16/"
done | tee "$OUT/kernel-times.md"
echo "all done at $((SECONDS - S0)) s"

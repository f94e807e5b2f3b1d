#!/usr/bin/env bash
# The δ pass on the SMs the main kernel leaves idle, its loads staged by cp.async (delta_on_idle_sms_kernel,
# 192 KB in flight an SM; the fifty-third session's register-only version ran at twice the spread pass's time),
# against main (base53: stableflash of c611149, whose production kernels are main's), one call, the timings first
# (a short lease may cut the checks, which decide only a merge the timings favour): (1) attention-ab.sh --bits and
# the A/B at the two 2,16,384 full shapes (96 CTAs, 36 SMs idle) and a control, compensated then rounded δ;
# (2) each backward kernel of the candidate alone at the GPU's clock (kernel_times.sh), 2,16,384 full, both head
# dims (main's: 5.76 / 22.74 / 5.57 us at D = 128, docs/benchmarks.md); (3) the candidate's attention GPU tests,
# memcheck and racecheck (the sanitizer cases, whose small grids take the idle-SM pass, and
# DeltaAloneEqualsTheBackwardsDeltaBitForBit, whose attention_delta takes the spread one; racecheck reports other
# than the known row-value hand-over counted apart). About 160 s.
# Carry .ab/base53.tar.xz, .ab/cand54.tar.xz (scripts/attention-ab.sh pack cand54 --no-lab), .peers.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
kt=docs/experiments/head-check-2026-12-07-s53/kernel_times.sh
. scripts/device-libs.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt"
unpack_ab_variants base53 cand54
AB_TAG=comp AB_DELTA=compensated AB_SHAPES=2x16x384x128:full,2x16x384x64:full,16x12x1024x64:full timeout 240 \
  scripts/attention-ab.sh --bits base53 cand54 | tail -12
echo "ab comp at $((SECONDS - S0)) s"
AB_TAG=rnd AB_DELTA=rounded AB_SHAPES=2x16x384x128:full,2x16x384x64:full timeout 120 scripts/attention-ab.sh base53 cand54 | tail -6
echo "ab rnd at $((SECONDS - S0)) s"
KT_BIN=.ab/cand54 KT_SHAPES=2x16x384x128:full,2x16x384x64:full timeout 90 bash $kt | tee "$OUT/kernel-times.md"
variant_tests_and_sanitizers cand54 '*DeltaAlone*:*Subnormal*'
echo "racecheck reports outside the row-value hand-over: $(grep -c 'Race reported' "$OUT/racecheck-cand54.log") in all, \
$(grep 'Race reported' "$OUT/racecheck-cand54.log" | grep -vc 'produce_row_values')"
tar -C "$OUT" -czf "$OUT/cand54-tests.tar.gz" tests-cand54.log memcheck-cand54.log racecheck-cand54.log && rm -f "$OUT"/{tests,memcheck,racecheck}-cand54.log
echo "all done at $((SECONDS - S0)) s"

#!/usr/bin/env bash
# usage: s45call2.sh [CANDIDATE]   (default lonepairs2)
# A lone-block pairs build against main (README.md here): the forward's time at the locked clock and
# at the real one beside cuDNN's, memory bytes read at GPT-2 full, the bench's A/B with the byte
# comparison, then the candidate's attention GPU tests, memcheck and racecheck (the pairs' test and
# the small sanitizer cases). Carry .ab and .peers with .ab/main.tar.xz (`scripts/attention-ab.sh pack
# main --bench-only`) and .ab/CANDIDATE.tar.xz (`scripts/attention-ab.sh pack CANDIDATE`); about 4
# minutes. Forty-fifth session: `lonepairs2`, each pair right after its two heads' whole tiles, against
# the main before it (merged); `lonepairs3` (late-pairs.patch on 3bed68c) against 3bed68c is pending.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
cand=${1:-lonepairs2}
. scripts/device-libs.sh && unpack_ab_variants main $cand
for v in main $cand; do echo "$v: $(tr '\n' ' ' < .ab/$v/built-from.txt)"; done
SH=16x12x1024x64:full,8x16x1000x64:full,16x12x1024x64:causal
for clock in locked real; do
  flag=$([ $clock = real ] && echo --real-clock)
  OUT=$OUT/cycles-$clock timeout 120 scripts/attention-cycles.sh $flag $SH main $cand $cand main >/dev/null 2>&1
  echo "cycles ($clock clock) rc $? at $((SECONDS - S0)) s"; cat "$OUT/cycles-$clock/attention-cycles.md"
done
for v in main $cand; do
  ( use_device_libraries .ab/$v; ncu --clock-control none --csv --print-units base --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
      --kernel-name regex:attention_forward --launch-skip 2 --launch-count 1 .ab/$v/stableflash bench attention --shapes 16x12x1024x64:full \
      --numerics fused --policy standard --delta-source compensated --warmup 0 --windows 1 --min-window-ms 1 --no-check 2>/dev/null ) |
    grep -E 'dram__bytes|lts__t_sector' | awk -F'","' -v v=$v '{printf "%s %s %s\n", v, $(NF-2), $NF}'
done
AB_SHAPES=$SH timeout 150 scripts/attention-ab.sh --bits main $cand > "$OUT/ab.log" 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -c "same bytes" "$OUT/ab.log"; grep -E "differ|failed" "$OUT/ab.log" | head -5; sed -n '/^| shape/,$p' "$OUT/ab.log"
( use_device_libraries .ab/$cand && timeout 120 .ab/$cand/attention_gpu_tests ) > "$OUT/tests-$cand.log" 2>&1
echo "tests rc $? at $((SECONDS - S0)) s"; grep -E "PASSED|FAILED|tests ran|Failure|SKIPPED" "$OUT/tests-$cand.log" | tail -8
for tool in memcheck racecheck; do
  ( use_device_libraries .ab/$cand && timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 .ab/$cand/attention_gpu_tests \
      --gtest_filter="*PairedLoneBlocks*:$SANITIZER_CASES" --gtest_brief=1 ) > "$OUT/$tool-$cand.log" 2>&1
  echo "$tool rc $? at $((SECONDS - S0)) s"; grep -E "SUMMARY|PASSED|FAILED" "$OUT/$tool-$cand.log" | tail -3
done

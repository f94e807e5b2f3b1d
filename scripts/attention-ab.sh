#!/usr/bin/env bash
# Kernel A/B in one device call: two or more builds of the attention (variants) timed alternately
# by `stableflash bench attention` on the same shapes, twice round (the second in the reverse
# order), with a table of each variant's TFLOP/s and its ratio to the first; the GPU tests and
# compute-sanitizer memcheck / racecheck on the variants asked for. The way every "Result (H200,
# one call, binaries alternating twice)" of docs/benchmarks.md' kernel history is measured: within
# one call the machine is the same, and the alternation shows the spread between runs next to the
# difference between variants.
#
#   here (no GPU), after each build to compare:
#     scripts/attention-ab.sh pack NAME        # .ab/NAME.tar.xz: stableflash, attention_gpu_tests,
#                                              # kernel_lab and their libraries from build-cuda
#     scripts/attention-ab.sh pack NAME --bench-only   # stableflash alone (a third of the bytes: more
#                                              # variants fit the device tool's 64 MiB; not for --tests or --lab)
#     scripts/attention-ab.sh pack NAME --no-lab       # stableflash and attention_gpu_tests (not for --lab)
#   GPU machine (carry .ab):
#     scripts/attention-ab.sh [--tests NAME[,NAME]] [--bits] [--lab NAME] NAME1 NAME2 [NAME3 ...]
#   --bits: before the bench, the forward's outputs (o, lse, the residual) of every other variant
#   compared with NAME1's byte for byte (`stableflash attention --device cuda` on the same random
#   inputs, D = 64 and 128, causal and full, the BF16 normalizer once), and the backward's (dq, dk,
#   dv, delta too) in deterministic mode, both numerics, with the compensated and the exact delta (rows
#   of up to 128 keys in the default mode too): what a change that claims the same bits must show.
#   (The forward's outputs are the fast path's since 2026-12-06; before, `stableflash attention
#   --device cuda` returned its counting run's, the units walk, so a forward candidate's "same bytes"
#   held for that walk only. The backward's comparisons were always of the kernels users run.)
#   AB_SHAPES="BxHxTxD:causal|full,..." replaces the shapes; AB_POLICY (default standard, the
#   default attention's) and AB_DELTA (default compensated) the options; --lab also runs
#   scripts/forward-lab.sh on that variant (FORWARD_LAB_SHAPES, FORWARD_LAB_VARIANTS as there).
#   AB_TEST_LIMIT (default 180 s) bounds a variant's GPU test run (the suite takes about 40 s; a
#   candidate that hangs fails there, naming the test that was running), as timeouts bound each
#   byte comparison (60 s) and bench run (300 s).
#   AB_TAG names this run's two output files (the table's and the log archive's names end in -TAG
#   before their extensions), so that several runs in one device call (another δ source, other
#   shapes) keep each other's results.
#
# Output: the table on stdout and in $OUT/attention-ab.md, with --bits followed by how many byte
# comparisons gave the same bytes and each one that did not (and $OUT/forward-lab.md with --lab); each
# run's bench output (ab-NAME-ROUND.txt), the test, sanitizer and byte-comparison logs and the lab's
# outputs in $OUT/ab-logs.tar.gz, so that the device tool's eight files bring all of it back
# (default OUT=/tmp/stableflash-device); exit status 1 if a test, a sanitizer, a run or the byte
# comparison failed.
set -uo pipefail
cd "$(dirname "$0")/.."
AB=.ab

if [ "${1:-}" = "pack" ]; then
  name=${2:?usage: scripts/attention-ab.sh pack NAME}
  [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "pack: NAME must be letters, digits, - or _ (got '$name')" >&2; exit 2; }
  bins="build-cuda/stableflash build-cuda/tests/attention_gpu/attention_gpu_tests build-cuda/kernel_lab"
  case "${3:-}" in
    "") ;;
    --bench-only) bins="build-cuda/stableflash" ;;
    --no-lab) bins="build-cuda/stableflash build-cuda/tests/attention_gpu/attention_gpu_tests" ;;
    *) echo "pack: unknown option '$3' (--bench-only, --no-lab or nothing)" >&2; exit 2 ;;
  esac
  for b in $bins; do [ -x "$b" ] || { echo "pack: no $b (ninja -C build-cuda stableflash attention_gpu_tests kernel_lab)" >&2; exit 2; }; done
  . scripts/device-libs.sh && require_dependency_records build-cuda || exit 2
  dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
  cp $bins "$dir"/ && strip "$dir"/* 2>/dev/null
  copy_runtime_libraries "$dir" $bins
  { git rev-parse HEAD; git status --porcelain --untracked-files=no | grep -q . && echo "uncommitted changes"; } >"$dir/built-from.txt" 2>/dev/null
  mkdir -p "$AB" && tar -C "$dir" -cf - . | xz -6 -T2 >"$AB/$name.tar.xz" || exit 1
  du -h "$AB/$name.tar.xz"
  exit 0
fi

tests=() lab= variants=() bits=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) IFS=, read -r -a tests <<<"${2:?--tests NAME[,NAME]}"; shift 2 ;;
    --bits) bits=1; shift ;;
    --lab) lab=${2:?--lab NAME}; shift 2 ;;
    -*) echo "unknown option: $1" >&2; exit 2 ;;
    *) variants+=("$1"); shift ;;
  esac
done
[ ${#variants[@]} -ge 2 ] || { echo "usage: scripts/attention-ab.sh [--tests NAME[,NAME]] [--bits] [--lab NAME] NAME1 NAME2 [...]" >&2; exit 2; }
OUT=${OUT:-/tmp/stableflash-device}
mkdir -p "$OUT"
[[ "${AB_TAG:-}" =~ ^[A-Za-z0-9_-]*$ ]] || { echo "AB_TAG: letters, digits, - or _ (got '$AB_TAG')" >&2; exit 2; }
tag=${AB_TAG:+-$AB_TAG}
. scripts/device-libs.sh
unpack_ab_variants "${variants[@]}" "${tests[@]}" ${lab:+"$lab"}
use_device_libraries "$AB/${variants[0]}"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
for v in "${variants[@]}"; do echo "$v: built from $(tr '\n' ' ' <"$AB/$v/built-from.txt")"; done

for v in "${tests[@]}"; do
  echo "=== $v: GPU tests ($(date +%T))"
  run_gtests "${AB_TEST_LIMIT:-180}" "$OUT/ab-tests-$v.log" "$AB/$v"/attention_gpu_tests || { echo "GPU tests of $v failed"; status=1; }
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$AB/$v"/attention_gpu_tests --gtest_filter="$SANITIZER_CASES" \
      --gtest_brief=1 >"$OUT/ab-$tool-$v.log" 2>&1 || { echo "compute-sanitizer $tool of $v failed"; status=1; }
    tail -1 "$OUT/ab-$tool-$v.log"
  done
done

if [ $bits = 1 ]; then
  a=${variants[0]}
  echo "=== the outputs of ${variants[*]:1} against $a's, byte for byte ($(date +%T))"
  : >"$OUT/ab-bytes.log"  # every verdict, for the table's summary below and the log archive
  python3 - "$OUT" <<'PY' || { echo "cannot write the inputs (python3 with torch and safetensors)"; status=1; }
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(7)
# d128many: 256 tiles of 128 rows, more than an SM's one (the persistent grid's later rounds);
# d128tail: 136 tiles, whose last 4 the plan splits into one-block items on 132 SMs (ws_tail_for)
for name, (B, H, T, D) in {"d128": (2, 8, 1000, 128), "d64": (2, 12, 1024, 64), "d128long": (1, 4, 2100, 128),
                           "d128many": (2, 16, 1000, 128), "d128tail": (1, 17, 1024, 128)}.items():
    save_file({n: (torch.randn(B, H, T, D, generator=g) * 2).to(torch.bfloat16) for n in ("q", "k", "v")},
              f"{sys.argv[1]}/ab-bits-{name}.safetensors")
# backward inputs (do beside q, k, v); T not a multiple of the 64-query blocks
# (and rows of one key block, bs*: up to 128 keys, where the main kernel stores dQ itself)
for name, (B, H, T, D) in {"bd128": (2, 4, 1000, 128), "bd64": (2, 6, 777, 64), "bs128": (2, 4, 128, 128), "bs64": (3, 6, 100, 64)}.items():
    save_file({n: (torch.randn(B, H, T, D, generator=g) * (2 if n != "do" else 1)).to(torch.bfloat16) for n in ("q", "k", "v", "do")},
              f"{sys.argv[1]}/ab-bits-{name}.safetensors")
PY
  # Runs every variant on input $2 with the options after it and compares each one's outputs with
  # the first's (label $1).
  compare_outputs() {
    local label=$1 input=$2 v
    shift 2
    rm -f "$OUT"/ab-bits-out-*.safetensors  # a failed run must not compare an earlier case's output
    for v in "${variants[@]}"; do
      timeout 60 "$AB/$v"/stableflash attention "$OUT/ab-bits-$input.safetensors" -o "$OUT/ab-bits-out-$v.safetensors" --device cuda "$@" \
        >"$OUT/ab-bits-$v.log" 2>&1 || { echo "attention of $v failed ($label)"; status=1; }
    done
    for v in "${variants[@]:1}"; do
      if cmp -s "$OUT/ab-bits-out-$a.safetensors" "$OUT/ab-bits-out-$v.safetensors"; then
        echo "same bytes: $label ($v)" | tee -a "$OUT/ab-bytes.log"
      else
        echo "DIFFERENT: $label ($v against $a)" | tee -a "$OUT/ab-bytes.log"
        status=1
      fi
    done
  }
  for c in "d128 full" "d128 causal" "d64 full" "d64 causal" "d128long full" "d128many full" "d128many causal" "d128tail full" "d64 causal bf16"; do
    read -r input mask normalizer <<<"$c"
    opts=(--numerics fused --policy "${AB_POLICY:-standard}" --delta-source compensated)
    [ "$mask" = causal ] && opts+=(--causal)
    [ -n "$normalizer" ] && opts+=(--normalizer "$normalizer")
    compare_outputs "$c" "$input" "${opts[@]}"
  done
  # The backward in deterministic mode (dQ added in key-block order; the other mode's bulk
  # reductions add in any order): o, lse, dq, dk, dv and delta, byte for byte, both numerics, delta
  # from the compensated output and the exact one (its own pass over the keys, delta_exact_kernel).
  for delta in compensated exact; do
    for c in "bd128 causal fused" "bd128 full paper" "bd64 causal paper" "bd64 full fused"; do
      read -r input mask numerics <<<"$c"
      opts=(--numerics "$numerics" --policy standard --delta-source "$delta" --deterministic)
      [ "$mask" = causal ] && opts+=(--causal)
      compare_outputs "backward $c, $delta delta" "$input" "${opts[@]}"
    done
  done
  # One key block: a query block's dQ has one CTA's part, so the default mode's bits are
  # reproducible too; compared in it (the path the trainer takes at T <= 128), with the exact delta
  # too (formed inside the main kernel there)
  for delta in compensated exact; do
    for c in "bs128 causal fused" "bs128 full paper" "bs64 causal paper" "bs64 full fused"; do
      read -r input mask numerics <<<"$c"
      opts=(--numerics "$numerics" --policy standard --delta-source "$delta")
      [ "$mask" = causal ] && opts+=(--causal)
      label="backward $c"
      [ "$delta" = compensated ] || label+=", $delta delta"
      compare_outputs "$label" "$input" "${opts[@]}"
    done
  done
  rm -f "$OUT"/ab-bits-*.safetensors
fi

# The benchmark shapes, the sweep's weakest and the persistent forward's corner cases (few tiles per
# SM, T not a multiple of the tiles)
shapes=${AB_SHAPES:-16x12x1024x64:causal,16x12x1024x64:full,8x16x4096x128:causal,2x16x16384x128:causal,1x8x4097x64:causal,1x8x4097x64:full,1x8x4097x128:causal,8x16x1000x128:full,2x16x2048x128:full,32x16x2048x64:causal,32x16x2048x128:causal,2x16x8192x64:full}
echo "=== bench, ${#variants[@]} variants alternating twice, the second round in reverse ($(date +%T))"
files=()
for round in 1 2; do
  # round 2 in the reverse order (A B, then B A): a drift over the call (clocks, temperature) or a
  # place in the order that favours one run shows as the two rounds disagreeing, not as a difference
  # between the variants (one shape of identical code read 0.95x for the third build in both rounds
  # when the order repeated)
  order=("${variants[@]}")
  [ $round = 2 ] && for ((i = 0; i < ${#variants[@]}; i++)); do order[i]=${variants[${#variants[@]} - 1 - i]}; done
  for v in "${order[@]}"; do
    timeout 300 "$AB/$v"/stableflash bench attention --shapes "$shapes" --numerics fused --policy "${AB_POLICY:-standard}" \
      --delta-source "${AB_DELTA:-compensated}" --windows 5 --no-check >"$OUT/ab-$v-$round.txt" 2>&1 ||
      { echo "bench of $v (round $round) failed"; status=1; }
  done
done
for v in "${variants[@]}"; do files+=("$OUT/ab-$v-1.txt" "$OUT/ab-$v-2.txt"); done
# bench rows: "B,H,T,D  mask  numerics  policy  delta  fwd_ms  fwd_TFLOP/s  bwd_ms  bwd_TFLOP/s  check"
{
  echo "TFLOP/s per variant (round 1, round 2; in parentheses the mean's ratio to ${variants[0]}), policy ${AB_POLICY:-standard}, δ ${AB_DELTA:-compensated}"
  echo
  printf '| shape | mask | pass |'; printf ' %s |' "${variants[@]}"; echo
  printf '|---|---|---|'; printf -- '---|%.0s' "${variants[@]}"; echo
  awk -v nv=${#variants[@]} 'FNR == 1 { f++ } /^[0-9]+,/ { k = $1 " | " $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
                                                        F[k, f] = $7; B[k, f] = $9 }
    function row(k, pass, A,   line, v, a, base) {
      base = A[k, 1] + A[k, 2]; line = "| " k " | " pass " |"
      for (v = 0; v < nv; v++) { a = 2 * v + 1
        line = line sprintf(" %.1f, %.1f", A[k, a], A[k, a + 1]) (v > 0 && base > 0 ? sprintf(" (%.3f)", (A[k, a] + A[k, a + 1]) / base) : "") " |" }
      return line }
    END { for (i = 1; i <= n; i++) { print row(order[i], "fwd", F); print row(order[i], "bwd", B) } }' "${files[@]}"
} | tee "$OUT/attention-ab$tag.md"
# the byte comparisons' verdicts beside the table, so that a call keeping only the table's lines still
# has them (each case's line is in ab-bytes.log in the log archive)
if [ $bits = 1 ]; then
  same=$(grep -c '^same bytes' "$OUT/ab-bytes.log") all=$(grep -c '' "$OUT/ab-bytes.log")
  { echo; echo "Byte comparisons against ${variants[0]}: $same of $all the same bytes"; grep '^DIFFERENT' "$OUT/ab-bytes.log"; } |
    tee -a "$OUT/attention-ab$tag.md"
fi

if [ -n "$lab" ]; then
  echo "=== forward lab on $lab ($(date +%T))"
  read -r -a lab_variants <<<"${FORWARD_LAB_VARIANTS:-production wgmma-ws wgmma-1wg}"
  OUT="$OUT" STABLEFLASH_DEVBIN="$AB/$lab" scripts/forward-lab.sh "${lab_variants[@]}" || status=1
fi
# Everything but the tables into one archive (the device tool brings back at most eight files).
logs=()
for f in "$OUT"/ab-*.txt "$OUT"/ab-*.log "$OUT"/forward-lab-*.txt; do [ -f "$f" ] && logs+=("$(basename "$f")"); done
if [ ${#logs[@]} -gt 0 ]; then
  tar -C "$OUT" -czf "$OUT/ab-logs$tag.tar.gz" "${logs[@]}" && (cd "$OUT" && rm -f "${logs[@]}") || { echo "cannot archive the logs"; status=1; }
fi
echo "=== done (status $status, $(date +%T))"
exit $status

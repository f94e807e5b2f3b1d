#!/usr/bin/env bash
# Per-instruction profile of our attention forward (or backward) beside cuDNN's on the GPU machine: Nsight Compute's
# warp-state and source counters (stall samples per SASS instruction) for one launch of each, then
# scripts/stall_table.py's side-by-side table (instructions per step by opcode, stall reasons, the
# opcodes that wait and on what, the key loop against the rest of the kernel). How the tenth and
# eleventh sessions' entries in docs/benchmarks.md "Kernel history" were found (the exponentials
# issued back to back, the producer's mbarrier spin, the work outside the step loop).
#
#   GPU machine:  scripts/profile-attention.sh [BxHxTxD:causal|full]     # default 2x16x8192x128:full
#   PROFILE_POLICY (default standard, the default attention's) and PROFILE_DELTA (default
#   compensated) set our options;
#   PROFILE_PASS=backward profiles the backward's main kernels instead (ours: attention_backward_wgmma,
#   cuDNN's: its bprop kernel), the work counted as the forward's scores (each of the five products
#   walks them once);
#   STABLEFLASH_DEVBIN the packed binaries (default build-cuda/devbin, `scripts/device-check.sh pack`).
#
# Output: the table on stdout and in $OUT/profile-attention-SHAPE.md (SHAPE as given, ':' -> '-'), and
# $OUT/profile-attention-SHAPE.tar.gz with both source pages as CSV and the logs (stall_table.py reads
# the CSVs again here); two files a shape, so several shapes fit the device tool's eight files. The
# Nsight Compute reports stay in $OUT/profile-{ours,cudnn}-SHAPE.ncu-rep only with PROFILE_KEEP_REPORTS=1
# (tens of MB; open them in the Nsight Compute GUI). Default OUT=/tmp/stableflash-device. About 30 s
# on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${STABLEFLASH_DEVBIN:-build-cuda/devbin}
OUT=${OUT:-/tmp/stableflash-device}
shape=${1:-2x16x8192x128:full}
[[ "$shape" =~ ^([0-9]+)x([0-9]+)x([0-9]+)x(64|128):(causal|full)$ ]] ||
  { echo "shape: BxHxTxD:causal|full with D 64 or 128 (got '$shape')" >&2; exit 2; }
B=${BASH_REMATCH[1]} H=${BASH_REMATCH[2]} T=${BASH_REMATCH[3]} D=${BASH_REMATCH[4]} mask=${BASH_REMATCH[5]}
mkdir -p "$OUT"
tag=${shape/:/-}
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
. scripts/device-libs.sh && require_devbin_program "$BIN" stableflash && use_device_libraries "$BIN"
command -v ncu >/dev/null || { echo "ncu (Nsight Compute) is not on PATH" >&2; exit 2; }

pass=${PROFILE_PASS:-forward}
case $pass in
  forward) ours_kernel=attention_forward cudnn_kernel=fprop ;;
  backward) ours_kernel=attention_backward_wgmma cudnn_kernel=bprop ;;
  *) echo "PROFILE_PASS: forward or backward (got '$pass')" >&2; exit 2 ;;
esac
sections=(--section WarpStateStats --section SourceCounters --section InstructionStats --section SpeedOfLight --section LaunchStats)
status=0
# Ours: the kernel the plan runs (launches 1-2 are the bench's warm-up).
ncu --kernel-name regex:"$ours_kernel" --launch-skip 2 --launch-count 1 "${sections[@]}" -f -o "$work/profile-ours" \
  "$BIN"/stableflash bench attention --shapes "$shape" --numerics fused --policy "${PROFILE_POLICY:-standard}" \
  --delta-source "${PROFILE_DELTA:-compensated}" --windows 1 --no-check >"$work/profile-ours.log" 2>&1 ||
  { echo "ncu of ours failed ($work/profile-ours.log):"; tail -5 "$work/profile-ours.log"; status=1; }
# cuDNN through PyTorch's SDPA (forward, or forward and backward)
ncu --kernel-name regex:"$cudnn_kernel" --launch-skip 2 --launch-count 1 "${sections[@]}" -f -o "$work/profile-cudnn" \
  python3 scripts/cudnn_sdpa_calls.py "$B" "$H" "$T" "$D" "$mask" "$pass" 4 >"$work/profile-cudnn.log" 2>&1 || { echo "ncu of cuDNN failed:"; tail -5 "$work/profile-cudnn.log"; status=1; }

for r in ours cudnn; do
  [ -f "$work/profile-$r.ncu-rep" ] || continue
  ncu --import "$work/profile-$r.ncu-rep" --page source --csv --print-source sass >"$work/profile-$r.csv" 2>"$work/profile-$r-csv.log" ||
    { echo "cannot export $r's source page"; status=1; }
done
if [ -s "$work/profile-ours.csv" ] && [ -s "$work/profile-cudnn.csv" ]; then
  {
    echo "$pass at $shape, ours (${PROFILE_POLICY:-standard} + ${PROFILE_DELTA:-compensated}) and cuDNN, one launch each under ncu"
    echo
    # the work in warp-steps (a warp's 16 rows by 128 keys: 2,048 scores), causal counting visible keys only
    steps=$(python3 -c "b,h,t=$B,$H,$T; print(b*h*(t*(t+1)//2 if '$mask'=='causal' else t*t)/2048)")
    python3 scripts/stall_table.py "$work/profile-ours.csv" "$work/profile-cudnn.csv" --names ours,cudnn --warp-steps "$steps"
  } | tee "$OUT/profile-attention-$tag.md" || status=1
  for r in ours cudnn; do  # duration, throughput, launch: the details page's summary lines
    echo; echo "== $r"
    ncu --import "$work/profile-$r.ncu-rep" --page details 2>/dev/null |
      grep -E "Duration|SM Frequency|Memory Throughput|Compute \(SM\)|Registers|Grid Size|Block Size|Shared Memory Config|Waves" 
  done | tee -a "$OUT/profile-attention-$tag.md"
fi
tar -C "$work" -czf "$OUT/profile-attention-$tag.tar.gz" $(cd "$work" && ls *.csv *.log 2>/dev/null) || status=1
if [ "${PROFILE_KEEP_REPORTS:-0}" = 1 ]; then
  for r in ours cudnn; do [ -f "$work/profile-$r.ncu-rep" ] && mv "$work/profile-$r.ncu-rep" "$OUT/profile-$r-$tag.ncu-rep"; done
fi
exit $status

#!/usr/bin/env bash
# Attention kernel times at Nsight Compute's locked base clock: our packed variants (.ab/NAME, from
# `scripts/attention-ab.sh pack NAME`) and cuDNN (PyTorch SDPA), one shape after another, each the
# median of three launches after two. Under sustained load the GPU runs at its power cap and a
# kernel's clock follows its power (docs/benchmarks.md, "The power state of a measurement"): a
# variant that stalls less draws more power and runs at a lower clock, so the bench's A/B
# (attention-ab.sh) under-reads what it saves in cycles and over-reads a variant that only draws
# less. At a locked clock the times are cycles. They are not the sweep's figures (there the clock
# floats, shared by every implementation's windows), and short shapes read the kernel alone, without
# the host.
#
#   GPU machine (carry .ab):  scripts/attention-cycles.sh [--backward|--exact-delta] [--delta SOURCE] [--cold] [--real-clock] SHAPES NAME [NAME ...]
#   SHAPES: BxHxTxD:causal|full,...; ours with the default options but δ compensated (standard shift).
#   --delta SOURCE: ours with that δ source instead (the forward writes the residual for `compensated`
#   only, so `--delta rounded` beside the default reads the residual's cost in cycles).
#   --backward: the backward's main kernel (attention_backward_wgmma; ours also runs a δ pass and a
#   dQ conversion, cuDNN its own helpers: neither is counted) instead of the forward kernel.
#   --exact-delta: the `exact` δ pass (delta_exact_kernel, ours with --delta-source exact) instead;
#   cuDNN's column is then its backward kernel, so the ratio is the pass's share of that time.
#   --cold: Nsight Compute flushes the caches before every profiled launch (its default); without
#   it the inputs stay in L2 from the launch before, as in the bench and the sweep.
#   --real-clock: the clock left to the GPU (Nsight Compute's --clock-control none): one launch at a
#   time, so near the boost clock, not the sweep's power cap either. Where a candidate moves memory
#   traffic, the locked clock can mislead: work that is memory-bound at the boost clock is not at the
#   base clock (docs/experiments/lone-blocks-2026-12-07: lone blocks at the schedule's end, -2% in
#   locked-clock time, +5% at the real clock, 46 MB more read from memory).
#
# Output (stdout and $OUT/attention-cycles.md): per shape each variant's microseconds, cuDNN's, and
# each variant / cuDNN in time (above 1: slower). Default OUT=/tmp/stableflash-device.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/stableflash-device}
ours=attention_forward cudnn=fprop pass=forward cache=none delta=compensated clock=base
while [ $# -gt 0 ]; do
  case "$1" in
    --backward) ours=attention_backward_wgmma cudnn=bprop pass=backward; shift ;;
    --exact-delta) ours=delta_exact_kernel cudnn=bprop pass=backward delta=exact; shift ;;
    --cold) cache=all; shift ;;
    --real-clock) clock=none; shift ;;
    --delta) delta=${2:?--delta: a δ source (rounded, compensated, exact)}; shift 2 ;;
    -*) echo "unknown option: $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
# the exact δ pass runs only with the exact δ (a later --delta would name another)
[ "$ours" != delta_exact_kernel ] || [ "$delta" = exact ] || { echo "--exact-delta times the exact δ's pass: no --delta $delta with it" >&2; exit 2; }
shapes=${1:?usage: scripts/attention-cycles.sh [--backward|--exact-delta] [--delta SOURCE] [--cold] SHAPES NAME [NAME ...]}
shift
[ $# -ge 1 ] || { echo "name at least one packed variant (.ab/NAME.tar.xz)" >&2; exit 2; }
command -v ncu >/dev/null || { echo "ncu (Nsight Compute) is not on PATH" >&2; exit 2; }
. scripts/device-libs.sh && unpack_ab_variants "$@"
mkdir -p "$OUT"
profile=(ncu --csv --print-units base --metrics gpu__time_duration.sum --cache-control "$cache" --clock-control "$clock" --launch-skip 2 --launch-count 3)
# the median of the profiled launches' durations (ns) -> us; "failed" if there were none
median_us() {
  python3 -c '
import csv, statistics, sys
v = [float(r["Metric Value"].replace(",", "")) for r in csv.DictReader(l for l in sys.stdin if l.startswith("\""))
     if r.get("Metric Name") == "gpu__time_duration.sum"]
print(f"{statistics.median(v) / 1000:.1f}" if v else "failed")'
}
{
  printf '| shape |'; printf ' %s us |' "$@"; printf ' cuDNN us |'; printf ' %s / cuDNN |' "$@"; echo
  printf '|---|'; for _ in "$@" "$@"; do printf -- '---|'; done; echo '---|'
} | tee "$OUT/attention-cycles.md"
for s in ${shapes//,/ }; do
  [[ $s =~ ^([0-9]+)x([0-9]+)x([0-9]+)x(64|128):(causal|full)$ ]] || { echo "shape: BxHxTxD:causal|full (got '$s')" >&2; exit 2; }
  B=${BASH_REMATCH[1]} H=${BASH_REMATCH[2]} T=${BASH_REMATCH[3]} D=${BASH_REMATCH[4]}
  mask=${BASH_REMATCH[5]}
  times=()
  for v in "$@"; do
    times+=("$( (. scripts/device-libs.sh && use_device_libraries ".ab/$v" &&
      "${profile[@]}" --kernel-name regex:"$ours" ".ab/$v/stableflash" bench attention --shapes "$s" --numerics fused \
        --policy standard --delta-source "$delta" --warmup 0 --windows 1 --min-window-ms 1 --no-check 2>/dev/null) | median_us)")
  done
  c_us=$("${profile[@]}" --kernel-name regex:"$cudnn" python3 scripts/cudnn_sdpa_calls.py "$B" "$H" "$T" "$D" "$mask" "$pass" 6 2>/dev/null | median_us)
  ratios=$(python3 -c "import sys; c = sys.argv[1]; print(' |'.join(f' {float(t) / float(c):.3f}' if 'failed' not in (t, c) else ' -' for t in sys.argv[2:]))" "$c_us" "${times[@]}")
  printf '| %s |' "$s"; printf ' %s |' "${times[@]}"; printf ' %s |%s |\n' "$c_us" "$ratios"
done | tee -a "$OUT/attention-cycles.md"

#!/usr/bin/env bash
# Every kernel of our attention call, each timed alone by Nsight Compute at the GPU's own clock
# (--clock-control none; ncu serializes launches, so the δ pass and the main backward do not overlap as they
# do under programmatic launch): the median duration per kernel name over 24 launches after 12, for each δ
# source named. What the residual costs where (forward's epilogue, δ pass, main backward), at short rows.
#   KT_BIN (default .ab/lab52) KT_SHAPES (BxHxTxD:causal|full,...) KT_DELTAS (default "compensated rounded")
#   KT_KERNELS (a regex of kernel names; default every kernel of the call, but the bench times the
#   forward first, so after the skip only the backward's kernels are left: 'forward' and KT_SKIP=2
#   for the forward alone; KT_SKIP, default 12: launches of those kernels skipped)
set -uo pipefail
BIN=${KT_BIN:-.ab/lab52}
. scripts/device-libs.sh && require_devbin_program "$BIN" stableflash && use_device_libraries "$BIN"
echo "| shape | δ | kernel | launches | median us |"
echo "|---|---|---|---|---|"
for s in ${KT_SHAPES//,/ }; do
  for d in ${KT_DELTAS:-compensated rounded}; do
    ncu --csv --print-units base --metrics gpu__time_duration.sum --cache-control none --clock-control none \
        --kernel-name regex:"${KT_KERNELS:-attention|delta|dq_convert}" --launch-skip "${KT_SKIP:-12}" --launch-count 24 \
        "$BIN/stableflash" bench attention --shapes "$s" --numerics fused --policy standard --delta-source "$d" \
        --warmup 0 --windows 1 --min-window-ms 1 --no-check 2>/dev/null |
    python3 -c '
import csv, statistics, sys, re
shape, delta = sys.argv[1], sys.argv[2]
t = {}
for r in csv.DictReader(l for l in sys.stdin if l.startswith("\"")):
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    name = re.sub(r"^(void )?(stableflash::attention::cuda::)?", "", r["Kernel Name"]).split("<")[0].split("(")[0]
    t.setdefault(name, []).append(float(r["Metric Value"].replace(",", "")))
for n, v in t.items(): print(f"| {shape} | {delta} | {n} | {len(v)} | {statistics.median(v) / 1000:.2f} |")
if not t: print(f"| {shape} | {delta} | (no kernel profiled) | 0 | - |")' "$s" "$d"
  done
done

#!/usr/bin/env bash
# Three cheap looks in one call (carry build-cuda/devbin.tar.xz and .peers; about 3 minutes):
# (1) the corrected clock probe (cuDNN's forward phase now ends at its own mark, not at the run's
#     midpoint) at the longest forward of the sweep, 32,16,2048,128 full;
# (2) what the residual costs the forward at the locked clock (Nsight Compute, ours with the
#     compensated against the rounded δ, the median of three launches) at three D = 128 full shapes;
# (3) the per-instruction profile of ours and cuDNN's forward at 2,16,2048,128 full
#     (scripts/profile-attention.sh), whose source pages (SASS with stall samples) stay in its tar.gz
#     for reading here: where cuDNN's consumers put a tile's end against its products.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
work=$(mktemp -d)
PROBE_SECONDS=3 OUT=$work/probe scripts/clock-probe.sh 32x16x2048x128:full
echo "probe done at $((SECONDS - S0)) s"
. scripts/device-libs.sh && use_device_libraries build-cuda/devbin
M=gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_write.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
for s in 2x16x384x128:full 2x16x2048x128:full 32x16x2048x128:full; do
  for d in compensated rounded; do
    ncu --csv --print-units base --metrics "$M" --clock-control base --cache-control none --launch-skip 2 --launch-count 3 \
      --kernel-name regex:attention_forward build-cuda/devbin/stableflash bench attention --shapes "$s" --numerics fused \
      --policy standard --delta-source "$d" --warmup 0 --windows 1 --min-window-ms 1 --no-check 2>/dev/null >"$work/res-${s/:/_}-$d.csv"
  done
done
python3 - "$work" <<'PY' | tee "$OUT/residual-cost.md"
import csv, glob, os, statistics, sys
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "res-*.csv"))):
    _, shape, delta = os.path.basename(f)[:-4].split("-")
    vals = {}
    for r in csv.DictReader(l for l in open(f) if l.startswith('"')):
        vals.setdefault(r["Metric Name"], []).append(float(r["Metric Value"].replace(",", "")))
    rows[(shape, delta)] = {k: statistics.median(v) for k, v in vals.items()}
print("| shape | us compensated | us rounded | ratio | M warp instr (c / r) | MB written (c / r) | tensor pipe % (c / r) |")
print("|---|---|---|---|---|---|---|")
for shape in sorted({s for s, _ in rows}):
    c, r = rows.get((shape, "compensated"), {}), rows.get((shape, "rounded"), {})
    g = lambda d, k, sc=1: d.get(k, float("nan")) * sc
    t = "gpu__time_duration.sum"
    print(f"| {shape} | {g(c,t,1e-3):.2f} | {g(r,t,1e-3):.2f} | {g(c,t)/g(r,t):.3f} | {g(c,'smsp__inst_executed.sum',1e-6):.2f} / {g(r,'smsp__inst_executed.sum',1e-6):.2f} "
          f"| {g(c,'dram__bytes_write.sum',1e-6):.1f} / {g(r,'dram__bytes_write.sum',1e-6):.1f} "
          f"| {g(c,'sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):.1f} / {g(r,'sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):.1f} |")
PY
echo "ncu done at $((SECONDS - S0)) s"
OUT=$work/prof scripts/profile-attention.sh 2x16x2048x128:full >"$work/prof.log" 2>&1; tail -3 "$work/prof.log"
cp "$work"/prof/profile-attention-*.tar.gz "$work"/prof/profile-attention-*.md "$OUT"/ 2>/dev/null
cp "$work/probe/clock-probe.md" "$OUT/clock-probe.md"; tar -C "$work/probe" -czf "$OUT/clock-probe.tar.gz" .
cat "$OUT/clock-probe.md"
echo "all done at $((SECONDS - S0)) s"

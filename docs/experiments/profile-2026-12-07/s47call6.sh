#!/usr/bin/env bash
# Where the D = 128 full forward stands against cuDNN's in counts (after the finite shift, the log2-unit
# scores, the store warp and the row sum's rounding): Nsight Compute at its locked base clock, ours
# (lfix47 = e5574af's stableflash) and cuDNN's fprop (scripts/cudnn_sdpa_calls.py) at two shapes, the
# median launch of three: time, warp instructions (all and uniform-datapath), issue slots busy, eligible
# warps, the tensor pipe, DRAM bytes. Carry .ab/lfix47.tar.xz and .peers; about 2 minutes.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants lfix47
M=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__inst_executed_pipe_uniform.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_eligible.avg.per_cycle_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed_op_shared_st.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_xu.sum
prof=(ncu --csv --print-units base --metrics "$M" --clock-control base --cache-control none --launch-skip 2 --launch-count 3)
for s in 2x16x2048x128:full 32x16x2048x128:full; do
  IFS=x: read -r B H T D mask <<<"$s"
  ( use_device_libraries .ab/lfix47 && "${prof[@]}" --kernel-name regex:attention_forward .ab/lfix47/stableflash bench attention --shapes "$s" \
      --numerics fused --policy standard --delta-source compensated --warmup 0 --windows 1 --min-window-ms 1 --no-check 2>/dev/null ) > "$OUT/ours-${s/:/_}.csv"
  "${prof[@]}" --kernel-name regex:fprop python3 scripts/cudnn_sdpa_calls.py "$B" "$H" "$T" "$D" "$mask" forward 6 > "$OUT/cudnn-${s/:/_}.csv" 2>/dev/null
  echo "$s done at $((SECONDS - S0)) s"
done
python3 - "$OUT" <<'PY'
import csv, statistics, sys, glob, os
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*.csv"))):
    who, shape = os.path.basename(f)[:-4].split("-", 1)
    vals = {}
    for r in csv.DictReader(l for l in open(f) if l.startswith('"')):
        vals.setdefault(r["Metric Name"], []).append(float(r["Metric Value"].replace(",", "")))
    rows[(shape, who)] = {k: statistics.median(v) for k, v in vals.items()}
names = [("gpu__time_duration.sum", "us", 1e-3), ("smsp__inst_executed.sum", "M warp instr", 1e-6),
         ("smsp__inst_executed_pipe_uniform.sum", "M uniform", 1e-6), ("smsp__inst_executed_pipe_fma.sum", "M fma pipe", 1e-6),
         ("smsp__inst_executed_pipe_alu.sum", "M alu pipe", 1e-6), ("smsp__inst_executed_pipe_xu.sum", "M xu pipe", 1e-6),
         ("smsp__inst_executed_op_shared_st.sum", "M shared st", 1e-6),
         ("smsp__issue_active.avg.pct_of_peak_sustained_active", "% issue busy", 1),
         ("smsp__warps_eligible.avg.per_cycle_active", "eligible warps", 1),
         ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "% tensor pipe", 1),
         ("dram__bytes_read.sum", "MB read", 1e-6), ("dram__bytes_write.sum", "MB written", 1e-6)]
with open(f"{out}/profile.md", "w") as md:
    for shape in sorted({s for s, _ in rows}):
        md.write(f"\n### {shape}\n\n| metric | ours | cuDNN | ours / cuDNN |\n|---|---|---|---|\n")
        for key, label, scale in names:
            o, c = rows.get((shape, "ours"), {}).get(key), rows.get((shape, "cudnn"), {}).get(key)
            fmt = lambda x: "-" if x is None else f"{x * scale:.2f}"
            md.write(f"| {label} | {fmt(o)} | {fmt(c)} | {o / c:.3f} |\n" if o and c else f"| {label} | {fmt(o)} | {fmt(c)} | - |\n")
print(open(f"{out}/profile.md").read())
PY

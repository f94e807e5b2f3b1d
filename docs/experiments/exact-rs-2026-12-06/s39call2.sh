#!/usr/bin/env bash
# session 39, call 2: where the exact δ pass and the D = 128 forward are bound, beside cuDNN's
# forward, at 1,8,16384,128 full (exact backward 0.773x cuDNN, forward 5.3% more time than cuDNN's
# at the locked clock in the s37/s38 measurements): Nsight Compute's speed-of-light, launch,
# memory-workload, compute and warp-state sections for one launch each of main39's delta_exact_kernel,
# pipe's (the next tile's S issued ahead, branch exact-pipelined), main39's forward and cuDNN's fprop.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p $OUT; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants main39 pipe
SHAPE=1x8x16384x128:full
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section WarpStateStats"
MET=(--metrics 'regex:^(sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active|sm__pipe_shared_cycles_active\.avg\.pct_of_peak_sustained_active|lts__t_bytes\.sum\.per_second|launch__cluster.*)$')

prof() {  # name kernel-regex command...
  local name=$1 k=$2; shift 2
  timeout 150 ncu $SEC --kernel-name regex:"$k" --launch-skip 2 --launch-count 1 "$@" > $OUT/ncu-$name.txt 2>&1
  echo "$name rc $? at $((SECONDS - S0)) s"
  timeout 60 ncu "${MET[@]}" --kernel-name regex:"$k" --launch-skip 2 --launch-count 1 "$@" > $OUT/ncu-$name-metrics.txt 2>&1
  echo "$name metrics rc $?"; grep -E "sm__pipe|lts__t_bytes|launch__cluster|ERROR" $OUT/ncu-$name-metrics.txt | head -12
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Cluster|Grid Size|Block Size|Registers Per|Shared Memory Config|lts__t_bytes|lts__t_sectors|mem_shared|hmma|pipe_xu|l1tex__throughput|Warp Cycles Per Issued|Issued Warp|Eligible|Achieved Occupancy|Mem Busy|Max Bandwidth|Mem Pipes" $OUT/ncu-$name.txt | head -40
}
BENCH=(bench attention --shapes $SHAPE --numerics fused --policy standard --warmup 0 --windows 1 --min-window-ms 1 --no-check)
(use_device_libraries .ab/main39 && prof delta-main39 delta_exact .ab/main39/stableflash "${BENCH[@]}" --delta-source exact)
(use_device_libraries .ab/pipe && prof delta-pipe delta_exact .ab/pipe/stableflash "${BENCH[@]}" --delta-source exact)
(use_device_libraries .ab/main39 && prof fwd-main39 attention_forward .ab/main39/stableflash "${BENCH[@]}" --delta-source compensated)
prof fwd-cudnn fprop python3 scripts/cudnn_sdpa_calls.py 1 8 16384 128 full forward 4
tar -C $OUT -czf $OUT/ncu-text.tar.gz $(cd $OUT && ls ncu-*.txt) && rm -f $OUT/ncu-*.txt
echo "done at $((SECONDS - S0)) s"

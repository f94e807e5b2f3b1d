#!/usr/bin/env bash
# The backward's kernels one by one, ours beside cuDNN's, on the GPU machine: Nsight Compute's
# gpu__time_duration of every kernel of one backward call (ours: the delta pass, the main kernel,
# the dQ conversion), with the clocks and caches left as they run (--clock-control none,
# --cache-control none); cuDNN through PyTorch's SDPA: the kernels of one backward under
# torch.profiler. Each kernel runs alone (ncu serializes them; the bench's back-to-back calls run
# hotter and slower), so compare the shares, not the sums with the bench's. Says where a backward's time goes that
# the main kernel's TFLOP/s does not show: the memory-bound passes around it, which weigh more the
# shorter the rows.
#
#   GPU machine:  scripts/backward-kernels.sh [BxHxTxD:causal|full ...]   # default: three D = 128 full shapes
#   BACKWARD_POLICY (default standard) and BACKWARD_DELTA (default compensated) set our options;
#   STABLEFLASH_DEVBIN the directory holding `stableflash` (default build-cuda/devbin).
#
# Output: a table (shape, kernel, us) on stdout and in $OUT/backward-kernels.md (default
# OUT=/tmp/stableflash-device); exit status 1 if a profile failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${STABLEFLASH_DEVBIN:-build-cuda/devbin}
OUT=${OUT:-/tmp/stableflash-device}
mkdir -p "$OUT"
[ $# -gt 0 ] || set -- 2x16x16384x128:full 32x16x2048x128:full 8x16x1000x128:full
. scripts/device-libs.sh && require_devbin_program "$BIN" stableflash && use_device_libraries "$BIN"
command -v ncu >/dev/null || { echo "ncu (Nsight Compute) is not on PATH" >&2; exit 2; }
ncu_time=(ncu --metrics gpu__time_duration.sum --clock-control none --cache-control none --csv --page raw)
status=0
{
  echo "| shape | who | kernel | us |"
  echo "|---|---|---|---|"
  for shape in "$@"; do
    [[ "$shape" =~ ^([0-9]+)x([0-9]+)x([0-9]+)x(64|128):(causal|full)$ ]] ||
      { echo "shape: BxHxTxD:causal|full (got '$shape')" >&2; exit 2; }
    B=${BASH_REMATCH[1]} H=${BASH_REMATCH[2]} T=${BASH_REMATCH[3]} D=${BASH_REMATCH[4]} mask=${BASH_REMATCH[5]}
    # ours: the bench's backward warm-up runs >= 3 calls of 3 kernels each; the second call's
    "${ncu_time[@]}" --kernel-name regex:"delta_from_output|attention_backward_wgmma|dq_convert" --launch-skip 3 --launch-count 3 \
      "$BIN"/stableflash bench attention --shapes "$shape" --numerics fused --policy "${BACKWARD_POLICY:-standard}" \
      --delta-source "${BACKWARD_DELTA:-compensated}" --warmup 0 --windows 1 --min-window-ms 0 --no-check \
      >"$OUT/backward-kernels-ours.csv" 2>"$OUT/backward-kernels-ours.log" || { echo "ncu of ours failed at $shape" >&2; status=1; }
    # cuDNN: its kernels of one backward (the third) under torch.profiler (CUPTI): the autograd
    # thread launches them, out of reach of an NVTX range on the main thread
    python3 - "$B" "$H" "$T" "$D" "$mask" >"$OUT/backward-kernels-cudnn.txt" 2>"$OUT/backward-kernels-cudnn.log" <<'EOF' ||
import re, sys, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import ProfilerActivity, profile
B, H, T, D = map(int, sys.argv[1:5])
q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for i in range(3):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=sys.argv[5] == "causal")
        g = torch.randn_like(o)
        torch.cuda.synchronize()
        if i < 2:
            o.backward(g)
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            o.backward(g)
            torch.cuda.synchronize()
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        print(f"{e.time_range.elapsed_us():.1f}\t" + re.sub(r"<.*>", "<>", re.sub(r"\(.*$", "", e.name))[:80])
EOF
      { echo "profile of cuDNN failed at $shape" >&2; status=1; }
    python3 - "$shape" "$OUT/backward-kernels-ours.csv" "$OUT/backward-kernels-cudnn.txt" <<'EOF' || status=1
import csv, re, sys
shape = sys.argv[1]
units = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
def ours(path):
    lines = [l for l in open(path) if l.startswith('"')]
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        return []
    head, unit_row = rows[0], rows[1]
    name_col, time_col = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    scale = units.get(unit_row[time_col], 1.0)
    return [(float(r[time_col].replace(",", "")) * scale, re.sub(r"<.*>", "<>", re.sub(r"\(.*$", "", r[name_col]))[:80]) for r in rows[2:]]
def cudnn(path):
    return [(float(us), name) for us, name in (l.rstrip("\n").split("\t", 1) for l in open(path) if "\t" in l)]
for who, kernels in (("ours", ours(sys.argv[2])), ("cuDNN", cudnn(sys.argv[3]))):
    if not kernels:
        print(f"| {shape} | {who} | (no kernels profiled) | |")
        continue
    for us, name in kernels:
        print(f"| {shape} | {who} | `{name}` | {us:.1f} |")
    print(f"| {shape} | {who} | **all** | **{sum(us for us, _ in kernels):.1f}** |")
EOF
  done
} | tee "$OUT/backward-kernels.md"
exit $status

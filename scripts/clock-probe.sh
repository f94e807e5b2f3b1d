#!/usr/bin/env bash
# Clocks and power while our attention and cuDNN's run back to back, on the GPU machine: the SM
# clock, board power, temperature and nvidia-smi's clock event reasons sampled every 100 ms while
# each implementation runs a long forward phase then a long backward phase of one shape (ours:
# `stableflash bench attention` with the recommended numerics; cuDNN: PyTorch SDPA's cuDNN backend
# in a loop timed the same way). Answers whether a kernel that is as fast as cuDNN's when it runs
# alone (scripts/backward-kernels.sh) falls behind in the bench because it runs at a lower clock
# under sustained load, i.e. spends more energy per FLOP. Reads the clocks, never sets them.
#
#   GPU machine:  scripts/clock-probe.sh [BxHxTxD:causal|full ...]   # default: two D = 128 shapes
#   PROBE_SECONDS (default 6): the length of each phase's warm-up; the timed windows add ~2 s.
#   PROBE_DELTA: our δ source instead of the recommended one (e.g. rounded: ours without the
#   residual's write and read, beside the default).
#
# Output: per implementation, shape and phase the per-call time and the mean clock and power over
# the phase's last seconds (table on stdout and in $OUT/clock-probe.md; the raw samples in
# $OUT/clock-probe-trace.csv). Exit status 1 if a run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${STABLEFLASH_DEVBIN:-build-cuda/devbin}
PEERS=${STABLEFLASH_PEERS:-.peers}
OUT=${OUT:-/tmp/stableflash-device}
SECONDS_WARM=${PROBE_SECONDS:-6}
mkdir -p "$OUT"
[ $# -gt 0 ] || set -- 32x16x2048x128:full 8x16x4096x128:causal
. scripts/device-libs.sh && require_devbin_program "$BIN" stableflash && use_device_libraries "$BIN"
[ -f "$PEERS/torch_peers.py" ] || { echo "no $PEERS/torch_peers.py (scripts/device-check.sh pack copies it)" >&2; exit 2; }
# the recommended attention: the trainer's default, from the library's one definition
policy=$("$BIN"/stableflash train --print-config | sed -n 's/^attention\.default\.policy=//p')
delta=${PROBE_DELTA:-$("$BIN"/stableflash train --print-config | sed -n 's/^attention\.default\.delta_source=//p')}
ours=ours${PROBE_DELTA:+-$PROBE_DELTA}  # the table's name for ours (ours-rounded with PROBE_DELTA=rounded)
trace=$OUT/clock-probe-trace.csv marks=$OUT/clock-probe-marks.txt
: >"$marks"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 100 >"$trace" 2>"$OUT/clock-probe-smi.log" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
mark() { echo "$(date +%s.%N) $*" >>"$marks"; }
status=0
sleep 2
for shape in "$@"; do
  [[ "$shape" =~ ^([0-9]+)x([0-9]+)x([0-9]+)x(64|128):(causal|full)$ ]] ||
    { echo "shape: BxHxTxD:causal|full (got '$shape')" >&2; exit 2; }
  B=${BASH_REMATCH[1]} H=${BASH_REMATCH[2]} T=${BASH_REMATCH[3]} D=${BASH_REMATCH[4]} mask=${BASH_REMATCH[5]}
  # ours: forward then backward, each SECONDS_WARM of warm-up and 7 windows of >= 300 ms; the marks
  # bracket the whole run, the summary splits it at the forward's expected end
  mark "$ours $shape begin"
  "$BIN"/stableflash bench attention --shapes "$shape" --numerics fused --policy "${policy:?}" --delta-source "${delta:?}" \
    --warmup "$SECONDS_WARM" --windows 7 --min-window-ms 300 --no-check >"$OUT/clock-probe-ours.txt" 2>&1 ||
    { echo "ours failed at $shape" >&2; cat "$OUT/clock-probe-ours.txt" >&2; status=1; }
  mark "$ours $shape end $(grep -E '^[0-9]+,' "$OUT/clock-probe-ours.txt" | awk '{print $6, $8}')"
  sleep 3
  python3 - "$B" "$H" "$T" "$D" "$mask" "$SECONDS_WARM" "$marks" "$PEERS" <<'EOF' || { echo "cuDNN failed at $shape" >&2; status=1; }
import os, sys, time, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
B, H, T, D = map(int, sys.argv[1:5]); causal = sys.argv[5] == "causal"; warm = float(sys.argv[6]); marks = sys.argv[7]
sys.path[:0] = [sys.argv[8], os.path.join(os.getcwd(), "scripts")]
from torch_peers import per_call_ms  # the peer's timing, behind peer_timing's untimed first call
from peer_timing import steady
shape = f"{B}x{H}x{T}x{D}:{sys.argv[5]}"
q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
def mark(s):
    with open(marks, "a") as f: f.write(f"{time.time():.6f} cudnn {shape} {s}\n")
timed = lambda fn: steady(per_call_ms, warm)(fn, min_window_ms=300.0)  # ours: 7 windows of >= 300 ms too
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    def fwd():
        with torch.no_grad(): F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    fwd(); torch.cuda.synchronize()
    mark("begin"); f_ms = timed(fwd)
    # the backward's first call builds cuDNN's plan (seconds at idle power): the phases split here,
    # not at the run's midpoint, or the forward's window takes in that idle stretch
    mark("fwd-end")
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    b_ms = timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    mark(f"end {f_ms:.3f} {b_ms:.3f}")
EOF
  sleep 3
done
sleep 1
kill $smi 2>/dev/null
wait $smi 2>/dev/null
python3 - "$trace" "$marks" "$SECONDS_WARM" <<'EOF' | tee "$OUT/clock-probe.md" || status=1
import sys, time, datetime
trace, marks, warm = sys.argv[1], sys.argv[2], float(sys.argv[3])
samples = []
for line in open(trace):
    f = [x.strip() for x in line.split(",")]
    if len(f) < 5: continue
    try:
        t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((t, float(f[1]), float(f[2]), float(f[3]), f[4]))
    except ValueError:
        continue
if not samples: sys.exit("no nvidia-smi samples (see clock-probe-smi.log)")
idle = [s for s in samples if s[0] < samples[0][0] + 1.5]
print(f"idle before: SM {sum(s[1] for s in idle)/len(idle):.0f} MHz, {sum(s[2] for s in idle)/len(idle):.0f} W")
runs, open_, split = [], {}, {}
for line in open(marks):
    p = line.split()
    key = (p[1], p[2])
    if p[3] == "begin": open_[key] = float(p[0])
    elif p[3] == "fwd-end": split[key] = float(p[0])
    elif p[3] == "end" and key in open_: runs.append((p[1], p[2], open_.pop(key), float(p[0]), p[4:6], split.pop(key, None)))
def stats(t0, t1):
    s = [x for x in samples if t0 <= x[0] < t1]
    if not s: return "(no samples)"
    reasons = sorted({x[4] for x in s})
    return (f"{sum(x[1] for x in s)/len(s):6.0f} MHz (min {min(x[1] for x in s):.0f}) {sum(x[2] for x in s)/len(s):5.0f} W "
            f"(max {max(x[2] for x in s):.0f}) {max(x[3] for x in s):3.0f} C  reasons {' '.join(reasons)}")
print("| who | shape | phase | ms/call | over the phase's timed windows and last 3 s of warm-up |")
print("|---|---|---|---|---|")
for who, shape, t0, t1, ms, fwd_end in runs:
    # a forward phase then a backward phase: split where the run marked it (cuDNN's), else at the
    # midpoint (ours: one bench process, the two phases of about equal length, warm-up + 7 windows)
    mid = fwd_end if fwd_end is not None else t0 + (t1 - t0) / 2
    for phase, a, b, m in (("fwd", t0, mid, ms[0] if ms else "?"), ("bwd", mid, t1, ms[1] if len(ms) > 1 else "?")):
        print(f"| {who} | {shape} | {phase} | {m} | {stats(a + (b - a) * 0.45, b - 0.2)} |")
EOF
exit $status

#!/usr/bin/env bash
# The attention sweep of issue 12 on the GPU machine: our attention (the trainer's default, read from
# `stableflash train --print-config`: today fused + standard shift + δ auto; and the same with
# the rounded δ: the cure's cost) beside the PyTorch peers
# (shared/peers/torch_peers.py `attention`: SDPA cuDNN and SDPA flash = FlashAttention-2) over a grid
# of shapes: B·H 8 to 512, T 128 to 16384 (1000 and 4097 are not multiples of 128), D 64 and 128,
# causal and full, plus the four benchmark shapes. All timed as device-check.sh times them (median
# over 7 windows of back-to-back calls, >= 20 ms each, after SWEEP_WARMUP seconds of warm-up, default
# 1.0: both sides measured at the GPU's power cap, as training runs; the peers' first call, where
# cuDNN builds its plan, untimed: scripts/peer_timing.py says why), one process for ours
# (every shape, both δ sources interleaved shape by shape) and one for the peers (torch_peers.py's own
# command line, parsed by its main(), once per shape in that process: a process per shape would
# spend seconds each importing PyTorch). From the packed binaries (scripts/device-check.sh pack).
#
#   GPU machine:  scripts/attention-sweep.sh [--quick] [--skip-peers] [--rounds N] [--interleaved [--graphs]]   # or scripts/device-check.sh ... --sweep
#   --interleaved: ours (the PyTorch op, the wheel: scripts/build-wheel.sh), cuDNN and FA2 timed in one
#   process, window by window in turn (scripts/attention-interleaved.py: every implementation after every
#   one, itself included, equally often), so that every implementation of a shape is timed in the same
#   mixture's power state (equal clocks); no oracle check (the GPU tests check the values)
#   --graphs (with --interleaved): each implementation's calls timed as CUDA graphs, the GPU's work
#   without the host's (short sequences are host-bound as eager calls, ours more than SDPA's)
#   anywhere:     scripts/attention-sweep.sh --estimate                  # the grid and its time estimate, runs nothing
#   SWEEP_SHAPES="BxHxTxD:causal|full,..." replaces the grid (the four benchmark shapes stay).
#   SWEEP_EXTRA_DELTAS="exact" times more of our δ sources beside the default's and the rounded one.
#   --rounds N (default 1): every shape measured N times, round after round (ours, then the peers'
#   process), the table from the median times (attention-sweep-plot.py); a single measurement's
#   spread is up to ±5% in the backward and the cure's cost, so N = 2 or 3 where those decide.
#
# Output in $OUT (default /tmp/stableflash-device): attention-sweep.tar.gz (attention-sweep.jsonl, every
# measurement, one JSON object a line; the table; the plots, if matplotlib imports there; the logs) and
# $OUT/attention-sweep.md (the table and the summary, also on stdout). Without matplotlib on the GPU machine,
# plot here from the JSONL:
#   PYTHONPATH=.deps/python python3 scripts/attention-sweep-plot.py attention-sweep.jsonl --out DIR
# and with --against docs/experiments/attention-sweep-DATE/attention-sweep.jsonl, how the ratios moved
# since an earlier sweep (from T = 1000 on: ranges, geometric means, counts, the shapes that moved).
# Exit status 1 if an oracle check failed or a part produced nothing; reaching 1.0x cuDNN or the 3%
# bound is reported, not enforced.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${STABLEFLASH_DEVBIN:-build-cuda/devbin}
PEERS=${STABLEFLASH_PEERS:-.peers}
quick=0 estimate_only=0 peers=1 rounds=1 interleaved=0 graphs=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --estimate) estimate_only=1 ;;
    --skip-peers) peers=0 ;;
    --interleaved) interleaved=1 ;;
    --graphs) graphs=--graphs ;;
    --rounds) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "--rounds: a positive count (got '${2:-}')" >&2; exit 2; }
              rounds=$2; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
[ -z "$graphs" ] || [ $interleaved = 1 ] || { echo "--graphs: only with --interleaved" >&2; exit 2; }
W=$(mktemp -d /tmp/attention-sweep.XXXXXX)
trap 'rm -rf "$W"' EXIT

# The grid and the time estimate. The estimate follows the timing method: per phase (forward,
# backward) a warm-up of max(SWEEP_WARMUP, 3 calls) plus ~1 call of overshoot (or the peers' untimed
# first call), one sizing call, 7 windows of
# max(20 ms, 1 call); a call's time from the FLOPs at rates at the low end of what the H200 measured
# (docs/benchmarks.md), so the estimate errs long.
WARM=${SWEEP_WARMUP:-1.0}
[[ "$WARM" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "SWEEP_WARMUP: seconds, e.g. 1.0 (got '$WARM')" >&2; exit 2; }
python3 - "$W" "$quick" "$peers" "${SWEEP_SHAPES:-}" "$rounds" "$WARM" "$interleaved" <<'EOF' || exit 2
import math, sys
w, quick, peers, override, rounds = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1", sys.argv[4], int(sys.argv[5])
warm, interleaved = float(sys.argv[6]), sys.argv[7] == "1"
BENCH = [(16, 12, 1024, 64, True), (16, 12, 1024, 64, False), (8, 16, 4096, 128, True), (2, 16, 16384, 128, True)]
# (B, H) per B·H, and the T of each: shorter T as B·H grows (the work grows as B·H·T²), every T of
# the issue at one B·H at least, 44 grid shapes in all: the time goes mostly to the fixed cost of a
# measurement (~0.9 s per implementation and shape, the warm-up and the windows), not to the FLOPs.
BH = {8: (1, 8), 32: (2, 16), 128: (8, 16), 512: (32, 16)}
T_OF = {8: (4097, 16384), 32: (384, 2048, 8192, 16384), 128: (128, 1000, 4097), 512: (128, 2048)}
if override:
    grid = []
    for s in override.split(","):
        dims, mask = (s.split(":") + ["causal"])[:2]
        b, h, t, d = map(int, dims.split("x"))
        grid.append((b, h, t, d, mask == "causal"))
elif quick:
    grid = [(1, 8, 4097, 64, True), (32, 16, 384, 128, False)]
else:
    grid = [(*BH[bh], t, d, causal) for d in (64, 128) for causal in (True, False) for bh in BH for t in T_OF[bh]]
shapes = list(dict.fromkeys(grid + BENCH))
# rates in TFLOP/s (forward, backward), the low end of the H200 runs; setup seconds per shape
RATES = {"ours": (250, 180), "cudnn": (300, 230), "flash": (190, 140)}
def flop(b, h, t, d, causal):
    return 4.0 * b * h * t * t * d / (2 if causal else 1)
def phase_s(call):
    return max(warm, 3 * call) + call + call + 7 * math.ceil(0.02 / call) * call + 0.02
def impl_s(name, s):
    f, (rf, rb) = flop(*s), RATES[name]
    return phase_s(f / rf / 1e12) + phase_s(2.5 * f / rb / 1e12) + (0.6 if name == "cudnn" else 0.05)
ours = rounds * (sum(2 * impl_s("ours", s) for s in shapes) + 8 * 0.5 + 2)  # 2 δ sources; 8 oracle checks; start
peer = (rounds * sum(impl_s("cudnn", s) + impl_s("flash", s) for s in shapes) + 8) if peers else 0.0  # start: import torch
if interleaved:  # one process: per shape and pass the first calls, the warm-up, 12 windows >= 30 ms of each
    def inter_s(s):
        calls = [flop(*s) / RATES[n][0] / 1e12 for n in ("ours", "ours", "cudnn", "flash")]
        calls += [2.5 * flop(*s) / RATES[n][1] / 1e12 for n in ("ours", "ours", "cudnn", "flash")]
        return 2 * warm + sum(2 * c + 13 * max(0.03, c) for c in calls) + 1.0
    ours, peer = rounds * sum(inter_s(s) for s in shapes) + 10, 0.0
with open(f"{w}/ours-shapes.txt", "w") as f:
    f.write(",".join(f"{b}x{h}x{t}x{d}:{'causal' if c else 'full'}" for b, h, t, d, c in shapes) + "\n")
with open(f"{w}/peer-shapes.txt", "w") as f:
    f.writelines(f"{b} {h} {t} {d} {int(c)}\n" for b, h, t, d, c in shapes)
with open(f"{w}/estimate.txt", "w") as f:
    f.write(f"{ours + peer:.0f} {ours:.0f} {peer:.0f}\n")
for d in sorted({s[3] for s in shapes}):
    for c in (True, False):
        row = sorted((s for s in shapes if s[3] == d and s[4] == c), key=lambda s: (s[0] * s[1], s[2]))
        if row:
            print(f"  D {d:3d} {'causal' if c else 'full  '}: " + " ".join(f"{s[0]}x{s[1]}x{s[2]}" for s in row))
parts = (f"ours (2 configurations), cuDNN and FA2 interleaved in one process" if interleaved else
         f"ours (2 configurations) {ours:.0f} s, peers (cuDNN, FA2) {peer:.0f} s")
print(f"{len(shapes)} shapes (grid{' (SWEEP_SHAPES)' if override else ' (--quick)' if quick else ''} + the four benchmark "
      f"shapes){f', {rounds} rounds' if rounds > 1 else ''}; estimated {ours + peer:.0f} s: {parts}")
EOF
read -r est_total est_ours est_peers <"$W/estimate.txt"
[ $estimate_only = 1 ] && exit 0

if [ ! -x "$BIN/stableflash" ] && [ -f "$BIN.tar.xz" ]; then
  mkdir -p "$BIN" && tar -C "$BIN" -xJf "$BIN.tar.xz" || { echo "cannot unpack $BIN.tar.xz" >&2; exit 2; }
fi
[ -x "$BIN/stableflash" ] || { echo "no $BIN/stableflash: build with CUDA and run scripts/device-check.sh pack" >&2; exit 2; }
[ $peers = 0 ] || [ -f "$PEERS/torch_peers.py" ] || { echo "no $PEERS/torch_peers.py (scripts/device-check.sh pack copies it)" >&2; exit 2; }
OUT=${OUT:-/tmp/stableflash-device}
mkdir -p "$OUT"
. scripts/device-libs.sh && use_device_libraries "$BIN"
status=0
start=$(date +%s)
step() { echo; echo "=== $* ($(date +%T), $(( $(date +%s) - start )) s)"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$W/device.txt"
# the commit the binaries were built from (device-check.sh pack records it)
commit=$(head -1 "$BIN/built-from.txt" 2>/dev/null || echo unknown)
default_policy=$("$BIN"/stableflash train --print-config | sed -n 's/^attention\.default\.policy=//p')
default_delta=$("$BIN"/stableflash train --print-config | sed -n 's/^attention\.default\.delta_source=//p')
echo "default attention: fused, policy ${default_policy:?}, delta_source ${default_delta:?}; the cure's cost: $default_delta vs rounded δ"
deltas=$default_delta
[ "$default_delta" = rounded ] || deltas="$default_delta,rounded"
# SWEEP_EXTRA_DELTAS (e.g. exact): more δ sources of ours, timed beside the two (in the JSONL, not
# the tables or plots, which read the default and the rounded δ)
[[ "${SWEEP_EXTRA_DELTAS:-}" =~ ^[a-z,]*$ ]] || { echo "SWEEP_EXTRA_DELTAS: comma-separated δ sources (got '$SWEEP_EXTRA_DELTAS')" >&2; exit 2; }
deltas="$deltas${SWEEP_EXTRA_DELTAS:+,$SWEEP_EXTRA_DELTAS}"

if [ $interleaved = 1 ]; then
  step "benchmark: ours (the PyTorch op) x {$deltas}, cuDNN, FA2, interleaved in one process, $rounds round(s) (estimated ${est_ours} s)"
  target=$(mktemp -d /tmp/stableflash-python.XXXXXX)
  : >"$W/interleaved-raw.jsonl"
  install_wheel "$BIN" "$target" "$W/install.log" || { status=1; rounds=0; }  # nothing to time without the op
  for ((round = 1; round <= rounds; ++round)); do
    [ "$rounds" = 1 ] || echo "--- round $round of $rounds"
    timeout $((2 * est_ours / rounds + 60)) env PYTHONUNBUFFERED=1 python3 scripts/attention-interleaved.py --peers "$PEERS" \
      --shapes "$(cat "$W/ours-shapes.txt")" --policy "$default_policy" --deltas "$deltas" --warmup "$WARM" $graphs \
      --json "$W/interleaved-round.jsonl" 2> >(tee -a "$W/interleaved.err" >&2) | tee -a "$W/interleaved.txt"
    rc=${PIPESTATUS[0]}
    cat "$W/interleaved-round.jsonl" >>"$W/interleaved-raw.jsonl" 2>/dev/null
    [ $rc = 0 ] || { echo "interleaved (round $round): exit $rc (124: timed out)"; status=1; }
  done
  rm -rf "$target" "$W/interleaved-round.jsonl"
  peers=0
else
  step "benchmark: ours, $(tr ',' '\n' <"$W/ours-shapes.txt" | wc -l) shapes x {$deltas}, $rounds round(s) (estimated ${est_ours} s)"
  : >"$W/ours-raw.jsonl"
  : >"$W/ours.txt"
  for ((round = 1; round <= rounds; ++round)); do
    [ "$rounds" = 1 ] || echo "--- round $round of $rounds" | tee -a "$W/ours.txt"
    timeout $((2 * est_ours / rounds + 60)) "$BIN"/stableflash bench attention --shapes "$(cat "$W/ours-shapes.txt")" --numerics fused \
      --policy "$default_policy" --delta-source "$deltas" --warmup "$WARM" --json "$W/ours-round.jsonl" 2>&1 | tee -a "$W/ours.txt"
    rc=${PIPESTATUS[0]}
    cat "$W/ours-round.jsonl" >>"$W/ours-raw.jsonl" 2>/dev/null
    [ $rc = 0 ] || { echo "bench attention (round $round): exit $rc (124: timed out)"; status=1; }
  done
  rm -f "$W/ours-round.jsonl"
fi

if [ $peers = 1 ]; then
  step "benchmark: peers, SDPA cuDNN and flash (FA2), one process (estimated ${est_peers} s)"
  # torch_peers.py as it is: its main() parses its own command line, once per shape; its timing
  # function behind peer_timing.py's untimed first call and warm-up
  timeout $((2 * est_peers + 60)) env PYTHONUNBUFFERED=1 python3 - "$PEERS" "$W/peer-shapes.txt" "$W/peers-raw.jsonl" "$rounds" "$WARM" 2>"$W/peers.err" <<'EOF'
import contextlib, io, json, os, sys, time
sys.path[:0] = [sys.argv[1], os.path.join(os.getcwd(), "scripts")]
import torch, torch_peers, peer_timing
peer_timing.install(torch_peers, float(sys.argv[5]))
out = open(sys.argv[3], "w")
rounds = int(sys.argv[4])
for line in [l for _ in range(rounds) for l in open(sys.argv[2])]:  # round after round, the shapes in order
    b, h, t, d, causal = map(int, line.split())
    argv = ["torch_peers.py", "attention", "--B", str(b), "--H", str(h), "--T", str(t), "--D", str(d), "--backends", "cudnn,flash"]
    argv += ["--causal"] if causal else []
    t0, buf = time.time(), io.StringIO()
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(buf):
            torch_peers.main()
        rec = json.loads(buf.getvalue().strip().splitlines()[-1])
    except (Exception, SystemExit) as e:  # record the failure, go on with the next shape
        rec = {"B": b, "H": h, "T": t, "D": d, "causal": bool(causal), "error": f"{type(e).__name__}: {str(e)[:200]}"}
    rec["argv"] = " ".join(argv[1:])
    out.write(json.dumps(rec) + "\n"); out.flush()
    def tf(n):
        r = rec.get(n, {})
        return f"{r['fwd_tflops']:6.1f} {r['bwd_tflops']:6.1f}" if "fwd_tflops" in r else f"{'error':>13}"
    print(f"{b},{h},{t},{d} {'causal' if causal else 'full  '}  cuDNN {tf('cudnn')}  FA2 {tf('flash')}  ({time.time() - t0:.1f} s)")
    torch.cuda.empty_cache()
EOF
  rc=$?
  [ $rc = 0 ] || { echo "peers: exit $rc (124: timed out); stderr:"; tail -5 "$W/peers.err"; status=1; }
fi

step "table and plots"
elapsed=$(( $(date +%s) - start ))
# one JSONL: a meta line, then every measurement with "impl" (stableflash, cudnn, flash)
python3 - "$W" "$default_policy" "$default_delta" "$commit" "$est_total" "$elapsed" "$interleaved" "$WARM" "$graphs" <<'EOF' || status=1
import json, os, sys
w, policy, delta, commit, est, elapsed, interleaved, warm, graphs = sys.argv[1:]
device = open(f"{w}/device.txt").read().strip()
rows = [{"meta": True, "default_policy": policy, "default_delta_source": delta, "commit": commit, "device": device,
         "estimate_s": float(est), "elapsed_s": float(elapsed), "warmup_s": float(warm),
         "method": ("interleaved in one process (attention-interleaved.py" + (", CUDA graphs)" if graphs else ", eager calls)"))
                   if interleaved == "1" else
                   "ours (stableflash bench attention), then the peers (torch_peers.py), one process each"}]
def lines(f):
    return [json.loads(l) for l in open(f) if l.strip()] if os.path.exists(f) else []
for r in lines(f"{w}/ours-raw.jsonl"):
    rows.append({"impl": "stableflash", **r})
rows += lines(f"{w}/interleaved-raw.jsonl")  # attention-interleaved.py's records carry "impl" already
for r in lines(f"{w}/peers-raw.jsonl"):
    shape = {k: r[k] for k in ("B", "H", "T", "D", "causal")}
    for name in ("cudnn", "flash"):
        rows.append({"impl": name, **shape, **r.get(name, {"error": r.get("error", "missing")}), "device": r.get("device", "")})
with open(f"{w}/attention-sweep.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
if len(rows) == 1:
    sys.exit("no measurements")
EOF
python3 scripts/attention-sweep-plot.py "$W/attention-sweep.jsonl" --out "$W" || status=1
grep -q '"check": "FAIL"' "$W/attention-sweep.jsonl" && { echo "an oracle check failed (see ours.txt)"; status=1; }
cp "$W/attention-sweep.md" "$OUT/attention-sweep.md" 2>/dev/null
rm -f "$W/ours-shapes.txt" "$W/peer-shapes.txt" "$W/estimate.txt"
tar -C "$W" -czf "$OUT/attention-sweep.tar.gz" . || status=1
echo "sweep: $(( $(date +%s) - start )) s (estimated $est_total s); $OUT/attention-sweep.tar.gz: $(tar -tzf "$OUT/attention-sweep.tar.gz" | grep -v '/$' | sed 's|^\./||' | tr '\n' ' ')"
exit $status

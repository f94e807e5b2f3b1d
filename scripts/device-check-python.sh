#!/usr/bin/env bash
# The Python part of scripts/device-check.sh (`device-check.sh --python` runs only this; it can also
# run alone on the GPU machine): install the wheel without network into a temporary folder, then
# the op's GPU tests, its cost over the C++ entry point, the nanoGPT-style training against SDPA and
# the bias audit of SDPA's backends and the op, ending with one table. Logs in $OUT/python-*.
#
#   scripts/device-check-python.sh [DEVBIN] [OUT] [--quick | --full] [--skip-audit | --audit-only]
#        defaults build-cuda/devbin, /tmp/stableflash-device, --full.
#   --quick (what `scripts/device-check.sh --python` runs; about 2 minutes on an H200; each part
#        under a time limit, 120 + 90 + 90 + 90 s, so that the whole stays under 6.5 even if one
#        hangs): opcheck on small shapes, values and gradients against SDPA in FP64 on issue 12's
#        four benchmark shapes at reduced batch x heads, the stride tests, torch.compile(fullgraph=True) with static shapes, the op's cost on one shape,
#        and the nanoGPT-style comparison on a smaller model (2 layers, 200 steps) whose rule must still
#        reject two broken attentions (python/examples/train_gpt.py). No bias audit (--full has it).
#   --full: every test, compile with dynamic shapes and a transformer block, the cost on three shapes
#        (single calls and per call of a 12-layer pass), the 4-layer 300-step training and the audit:
#        146 s + 51 s on the H200 (2026-12-01) as the two halves --skip-audit / --audit-only.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build-cuda/devbin}
OUT=${2:-/tmp/stableflash-device}
quick=0 main=1 audit=1
for a in "${@:3}"; do
  case "$a" in
    --quick) quick=1 ;;
    --full) quick=0 ;;
    --skip-audit) audit=0 ;;
    --audit-only) main=0 ;;
    *) echo "unknown argument: $a" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
if [ ! -d "$BIN" ] && [ -f "$BIN.tar.xz" ]; then  # as scripts/device-check.sh does, for a run of this part alone
  mkdir -p "$BIN" && tar -C "$BIN" -xJf "$BIN.tar.xz" || { echo "cannot unpack $BIN.tar.xz" >&2; exit 2; }
fi
# the C++ program (its benchmark, the audit) needs the devbin's libraries and the image's cuBLASLt
# (device-check.sh has set them already; a run alone sets them here)
. scripts/device-libs.sh && use_device_libraries "$BIN"
export SF_BIN=${SF_BIN:-$PWD/$BIN} SF_PEERS=${SF_PEERS:-$PWD/.peers}
step() { echo; echo "=== $* ($(date +%T))"; }
t_start=$SECONDS
rows=()
status=0

step "python: install the wheel (--no-index, --target a temporary folder)"
target=$(mktemp -d /tmp/stableflash-python.XXXXXX)
install_wheel "$BIN" "$target" "$OUT/python-install.log" || exit 1
where=$(python3 -c 'import stableflash.torch, torch; print(stableflash.torch.__file__, "torch", torch.__version__, torch.version.cuda)' 2>&1) ||
  { echo "$where"; echo "import stableflash.torch failed"; exit 1; }
echo "$(basename "$wheel"): $how; $where"
rows+=("| install | ok | $(basename "$wheel"), $how | |")

# part NAME LOGNAME SUMMARY_REGEX TIMEOUT COMMAND...: runs it, keeps its log, adds a table row
part() {
  local name=$1 log="$OUT/python-$2.log" pattern=$3 limit=$4
  shift 4
  step "python: $name"
  local t0=$SECONDS
  PYTHONUNBUFFERED=1 timeout "$limit" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local summary
  summary=$(grep -E "$pattern" "$log" | tail -1 | tr '|' '/')
  [ $rc = 0 ] || status=1
  rows+=("| $name | $([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)") | ${summary:-see $log} | $((SECONDS - t0)) |")
}

if [ $quick = 1 ]; then
  mode=quick
  [ $main = 1 ] || { echo "--audit-only is a --full part (the quick mode has no audit)"; exit 2; }
  part "op tests, quick (opcheck small, values on the 4 benchmark shapes, strides)" op-tests "passed, .* failed" 120 \
    python3 tests/python_gpu/test_op.py --quick
  part "torch.compile (fullgraph, static shapes)" compile "passed, .* failed" 90 python3 tests/python_gpu/test_compile.py --quick
  part "op cost over the C++ entry point (GPT-2 shape)" bench "largest op" 90 \
    python3 tests/python_gpu/bench_op.py --quick --json "$OUT/python-bench.jsonl"
  part "nanoGPT-style training, op vs SDPA (quick: 2 layers, 200 steps; 2 controls)" train "reaches SDPA" 90 \
    python3 python/examples/train_gpt.py --quick
  rows+=("| bias audit | not run | quick mode; --full runs scripts/audit-torch-peers.sh | |")
else
  mode=full
  if [ $main = 1 ]; then
    part "op tests (opcheck, values vs SDPA FP64, layouts, strides, stream)" op-tests "passed, .* failed" 900 \
      python3 tests/python_gpu/test_op.py
    part "torch.compile (fullgraph)" compile "passed, .* failed" 600 python3 tests/python_gpu/test_compile.py
    part "op cost over the C++ entry point" bench "largest op" 600 python3 tests/python_gpu/bench_op.py --json "$OUT/python-bench.jsonl"
    part "nanoGPT-style training, op vs SDPA (300 steps; 2 controls)" train "reaches SDPA" 900 \
      python3 python/examples/train_gpt.py --steps 300
  fi
  if [ $audit = 1 ]; then
    # SF_AUDIT_FLAGS: grid flags (e.g. "--D 128"); unset, the audit's default grid (D = 64)
    part "bias audit: SDPA backends and the op (table in python-audit/table.txt)" audit "^$" 900 env OUT="$OUT/python-audit" scripts/audit-torch-peers.sh ${SF_AUDIT_FLAGS:-}
  fi
fi

step "python: summary"
{
  echo "| part ($mode mode) | result | summary | seconds |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo "| total | $([ $status = 0 ] && echo ok || echo FAILED) | $mode mode | $((SECONDS - t_start)) |"
} | tee "$OUT/python-table.md"
rm -rf "$target"
exit $status

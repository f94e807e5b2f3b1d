#!/usr/bin/env bash
# The Python part of scripts/device-check.sh (`device-check.sh --python` runs only this; it can also
# run alone on the GPU machine): install the wheel without network into a temporary folder, then
# the op's GPU tests, its cost over the C++ entry point, the nanoGPT-style training against SDPA and
# the bias audit of SDPA's backends and the op, ending with a table. Logs in $OUT/python-*.
#
#   scripts/device-check-python.sh [DEVBIN] [OUT] [--quick] [--skip-audit | --audit-only]
#        defaults build-cuda/devbin, /tmp/stableflash-device; the whole part takes roughly 10 minutes on
#        an H200, so a caller with a per-command limit can run it in two halves with the last two flags
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build-cuda/devbin}
OUT=${2:-/tmp/stableflash-device}
quick=0 main=1 audit=1
for a in "${@:3}"; do
  case "$a" in
    --quick) quick=1 ;;
    --skip-audit) audit=0 ;;
    --audit-only) main=0 ;;
    *) echo "unknown argument: $a" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
if [ ! -d "$BIN" ] && [ -f "$BIN.tar.xz" ]; then  # as scripts/device-check.sh does, for a run of this part alone
  mkdir -p "$BIN" && tar -C "$BIN" -xJf "$BIN.tar.xz" || { echo "cannot unpack $BIN.tar.xz" >&2; exit 2; }
fi
# the C++ program (its benchmark, the audit) needs the devbin's libraries and the image's cuBLASLt;
# device-check.sh has set this already, a run alone sets it here
if [[ ":${LD_LIBRARY_PATH:-}:" != *":$PWD/$BIN:"* ]]; then
  image_libs=$(python3 -c 'import nvidia, os; r = os.path.dirname(nvidia.__path__[0]); print(":".join(os.path.join(r, "nvidia", d, "lib") for d in ("cublas", "nccl", "cu13")))' 2>/dev/null)
  export LD_LIBRARY_PATH="$PWD/$BIN:/usr/local/cuda/lib64${image_libs:+:$image_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export SF_BIN=${SF_BIN:-$PWD/$BIN} SF_PEERS=${SF_PEERS:-$PWD/.peers}
step() { echo; echo "=== $* ($(date +%T))"; }
rows=()
status=0

step "python: install the wheel (--no-index, --target a temporary folder)"
wheel=$(ls "$BIN"/stableflash-*.whl build-cuda/wheel/stableflash-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  echo "no stableflash-*.whl in $BIN or build-cuda/wheel (here: scripts/build-wheel.sh, then scripts/device-check.sh pack)"
  exit 1
fi
target=$(mktemp -d /tmp/stableflash-python.XXXXXX)
if python3 -m pip --version >/dev/null 2>&1; then
  python3 -m pip install --no-index --no-deps --target "$target" "$wheel" >"$OUT/python-install.log" 2>&1 ||
    { cat "$OUT/python-install.log"; echo "pip install failed"; exit 1; }
  how="pip install --no-index --target"
else  # a wheel is a zip laid out as installed; this is what pip would do for it
  python3 -m zipfile -e "$wheel" "$target" || exit 1
  how="unzipped (no pip here)"
fi
export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
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

if [ $main = 1 ]; then
  part "op tests (opcheck, values vs SDPA FP64, layouts, stream)" op-tests "passed, .* failed" 900 \
    python3 tests/python_gpu/test_op.py
  part "torch.compile (fullgraph)" compile "passed, .* failed" 600 python3 tests/python_gpu/test_compile.py
  part "op cost over the C++ entry point" bench "largest op" 600 python3 tests/python_gpu/bench_op.py --json "$OUT/python-bench.jsonl"
  steps=300
  [ $quick = 1 ] && steps=150
  part "nanoGPT-style training, op vs SDPA ($steps steps)" train "reaches SDPA" 900 python3 python/examples/train_gpt.py --steps $steps
fi
if [ $audit = 1 ]; then
  part "bias audit: SDPA backends and the op (table in python-audit/table.txt)" audit "^$" 900 env OUT="$OUT/python-audit" scripts/audit-torch-peers.sh
fi

step "python: summary"
{
  echo "| part | result | summary | seconds |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/python-table.md"
rm -rf "$target"
exit $status

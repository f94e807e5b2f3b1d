#!/usr/bin/env bash
# The bias audit of PyTorch's attention (issue 14, docs/numerics-findings.md "Auditing another
# implementation"): export the audit's cases, run each through SDPA's flash, cuDNN and
# memory-efficient backends (torch_peers.py's `values`, called in one Python process), and measure
# their outputs with `stableflash audit --import`, one table for all backends.
#
#   GPU machine:  scripts/audit-torch-peers.sh [audit grid flags]        e.g. --grid full, --T 1024
#
# Environment:
#   SF_BIN      folder holding stableflash (default build-cuda/devbin if present, else build); the
#               export and import run on the CPU, any build will do
#   SF_PEERS    folder holding torch_peers.py (default .peers if present, else ../shared/peers)
#   OUT         where the export, the outputs, the table and the JSON go (default /tmp/stableflash-audit-peers)
#   BACKENDS    SDPA backends (default "flash cudnn efficient")
#   FAIL_ABOVE  optional: exit 3 when any |bias| exceeds it (stableflash audit --fail-above)
# The stableflash op (python/, docs/python.md) is audited too when `import stableflash.torch` works
# (scripts/device-check.sh --python puts the installed wheel on PYTHONPATH): with its default
# shift (standard, the one SDPA's backends use) and with hashed_offset.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SF_BIN:-}" ]; then
  if [ -x build-cuda/devbin/stableflash ]; then SF_BIN=build-cuda/devbin; else SF_BIN=build; fi
fi
if [ -z "${SF_PEERS:-}" ]; then
  if [ -f .peers/torch_peers.py ]; then SF_PEERS=.peers; else SF_PEERS=../shared/peers; fi
fi
OUT=${OUT:-/tmp/stableflash-audit-peers}
BACKENDS=${BACKENDS:-flash cudnn efficient}
sf="$SF_BIN/stableflash"
[ -x "$sf" ] || { echo "no stableflash in $SF_BIN (set SF_BIN)" >&2; exit 2; }
[ -f "$SF_PEERS/torch_peers.py" ] || { echo "no torch_peers.py in $SF_PEERS (set SF_PEERS)" >&2; exit 2; }
# the devbin build carries its own shared libraries (scripts/device-check.sh pack)
export LD_LIBRARY_PATH="$PWD/$SF_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

rm -rf "$OUT/export"
mkdir -p "$OUT"
echo "=== export ($*)"
"$sf" audit "$@" --export "$OUT/export"

# Outputs of one implementation in the import layout: EXPORT/NAME/<case>.safetensors with o [1, H, T, D].
# A backend that refuses a shape leaves that case's file missing; the import then names it.
run_python() {  # run_python NAME BACKEND|op:POLICY
  python3 - "$SF_PEERS" "$OUT/export" "$1" "$2" <<'EOF'
import argparse, json, os, sys
peers, export, name, backend = sys.argv[1:5]
sys.path.insert(0, peers)
m = json.load(open(os.path.join(export, "manifest.json")))
os.makedirs(os.path.join(export, name), exist_ok=True)
failed = 0
for c in m["cases"]:
    a = c["attention"]
    assert a["layout"] == "bhtd" and a["batch"] == 1, a
    inp = os.path.join(export, c["inputs"])
    out = os.path.join(export, name, c["id"] + ".safetensors")
    try:
        if backend.startswith("op:"):  # the stableflash op, as a user calls it in place of SDPA
            import torch
            from safetensors.torch import load_file, save_file
            import stableflash.torch as sft
            t = load_file(inp, device="cuda")
            o = sft.attention(t["q"], t["k"], t["v"], causal=a["causal"], scale=a["scale"], layout="bhtd",
                              policy=backend[3:])
            save_file({"o": o.contiguous().cpu()}, out)
        else:
            import torch_peers
            torch_peers.attention_values(argparse.Namespace(inp=inp, out=out, backend=backend,
                                                            causal=a["causal"], scale=a["scale"]))
    except (Exception, SystemExit) as e:
        failed += 1
        print(f"{name} {c['id']}: {str(e)[:200]}", file=sys.stderr)
print(f"{name}: {len(m['cases']) - failed}/{len(m['cases'])} cases written", file=sys.stderr)
sys.exit(1 if failed else 0)
EOF
}

names=()
for b in $BACKENDS; do
  echo "=== SDPA $b"
  if run_python "sdpa-$b" "$b" > "$OUT/sdpa-$b.log"; then names+=("sdpa-$b"); else echo "sdpa-$b: some cases failed (see above); left out of the table" >&2; fi
done
if python3 -c "import stableflash.torch" 2>/dev/null; then
  for policy in standard hashed_offset; do
    echo "=== stableflash op, policy $policy"
    if run_python "stableflash-op-$policy" "op:$policy" > "$OUT/stableflash-op-$policy.log"; then
      names+=("stableflash-op-$policy")
    else
      echo "stableflash-op-$policy: some cases failed (see above); left out of the table" >&2
    fi
  done
else
  echo "=== stableflash op: not audited (import stableflash.torch failed; install the wheel, docs/python.md)" >&2
fi
[ ${#names[@]} -gt 0 ] || { echo "no implementation produced outputs" >&2; exit 1; }

list=$(IFS=,; echo "${names[*]}")
"$sf" audit --import "$OUT/export" --name "$list" --json > "$OUT/peers.jsonl"
gate=()
[ -n "${FAIL_ABOVE:-}" ] && gate=(--fail-above "$FAIL_ABOVE")
"$sf" audit --import "$OUT/export" --name "$list" "${gate[@]}" | tee "$OUT/table.txt"

#!/usr/bin/env bash
# The audit call again (written in the forty-first session, run in the forty-third: audit-s41), after
# s41audit.sh, its parts in the order of what is new (so that a short device budget gets the first): the CLI's forward against the op's
# byte for byte (cli_vs_op.py: 739ba72 never checked on a GPU), device-check's CPU vs CUDA compare as
# committed (D 64 and 128 by default, the noise floor scaled to the logit scale; computed here from
# s41audit.sh's rows, audit-s41), then the op's audit at D = 128 with only its table, JSON and summary
# brought back (s41audit.sh's export was too many files; its summary is in audit-s41 too).
# Binaries: `scripts/device-check.sh pack --sweep-only` (carry build-cuda/devbin.tar.xz, .peers).
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
[ -d build-cuda/devbin ] || { mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz; } || exit 2
cat build-cuda/devbin/built-from.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=$(mktemp -d)
# the CLI's outputs are the op's (forward_from_host's second forward without counters, 739ba72)
( . scripts/device-libs.sh && use_device_libraries build-cuda/devbin && install_wheel build-cuda/devbin "$W/py" "$W/install.log" &&
  python3 docs/experiments/log2-units-2026-12-06/cli_vs_op.py build-cuda/devbin/stableflash "$W/cli" ) 2>&1 | tee "$OUT/cli-vs-op.txt"
echo "cli vs op at $((SECONDS - S0)) s"
scripts/device-check.sh --skip-tests --skip-sanitizer --skip-bench --skip-peer-values --skip-train --skip-dist \
  --skip-python >"$OUT/audit-cpp.log" 2>&1
echo "C++ audit rc $? at $((SECONDS - S0)) s"; grep -E "binaries|audit rows|differs" "$OUT/audit-cpp.log" | head -20
SF_AUDIT_FLAGS="--D 128" scripts/device-check-python.sh build-cuda/devbin "$W" --full --audit-only >"$OUT/python-audit.log" 2>&1
echo "op audit rc $? at $((SECONDS - S0)) s"
cp "$W"/python-table.md "$W"/python-audit/table.txt "$W"/python-audit/peers.jsonl "$OUT"/ 2>/dev/null
python3 docs/experiments/log2-units-2026-12-06/op_audit_summary.py "$W"/python-audit/peers.jsonl | tee "$OUT/op-audit-summary.txt"

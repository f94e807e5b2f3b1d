#!/usr/bin/env bash
# Pending call 3 of docs/benchmarks.md: the bias audit with the log2-unit forward (forty-first session).
# Binaries: `scripts/device-check.sh pack --sweep-only` (stableflash and the wheel; carry
# build-cuda/devbin.tar.xz and .peers). (1) The C++ audit, CPU against --device cuda, at D = 64 and 128
# (the CUDA audit measures the outputs of a forward without counters, the fast path, since 39cd5bb);
# (2) the op's audit through the wheel beside SDPA's backends at D = 128, whose scale takes the
# log2-unit scores (the default grid is D = 64).
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
SF_AUDIT_FLAGS="--D 64,128" scripts/device-check.sh --skip-tests --skip-sanitizer --skip-bench --skip-peer-values \
  --skip-train --skip-dist --skip-python >"$OUT/audit-cpp.log" 2>&1
echo "C++ audit rc $? at $((SECONDS - S0)) s"; grep -E "binaries|audit rows|differs" "$OUT/audit-cpp.log" | head -20
SF_AUDIT_FLAGS="--D 128" scripts/device-check-python.sh build-cuda/devbin "$OUT" --full --audit-only >"$OUT/python-audit.log" 2>&1
echo "op audit rc $? at $((SECONDS - S0)) s"; cat "$OUT/python-table.md"; cat "$OUT/python-audit/table.txt" 2>/dev/null | head -60

#!/usr/bin/env bash
# The part of s41audit2.sh not yet run on a GPU, first, for a short device budget (forty-second
# session): the check of 739ba72 (cli_vs_op.py: the CLI's forward against the op's, byte for byte);
# then device-check's C++ audit compare as committed (its results on the forty-first session's data
# are in audit-s41; the op's audit summary needs no new run). Binaries: `scripts/device-check.sh pack --sweep-only` (carry
# build-cuda/devbin.tar.xz, .peers).
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
[ -d build-cuda/devbin ] || { mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz; } || exit 2
cat build-cuda/devbin/built-from.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=$(mktemp -d)
( . scripts/device-libs.sh && use_device_libraries build-cuda/devbin && install_wheel build-cuda/devbin "$W/py" "$W/install.log" &&
  python3 docs/experiments/log2-units-2026-12-06/cli_vs_op.py build-cuda/devbin/stableflash "$W/cli" ) 2>&1 | tee "$OUT/cli-vs-op.txt"
echo "cli vs op at $((SECONDS - S0)) s"
scripts/device-check.sh --skip-tests --skip-sanitizer --skip-bench --skip-peer-values --skip-train --skip-dist \
  --skip-python >"$OUT/audit-cpp.log" 2>&1
echo "C++ audit rc $? at $((SECONDS - S0)) s"; grep -E "binaries|audit rows|differs" "$OUT/audit-cpp.log" | head -20

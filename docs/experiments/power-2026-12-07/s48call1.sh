#!/usr/bin/env bash
# Does our forward draw more power a FLOP than cuDNN's? (The fifteenth session's probe read ours at the
# 700 W cap, ~690 W, and cuDNN at ~530 W; never asked again since the kernels changed.) Sustained phases
# of ours (recommended numerics), ours with the rounded δ (no residual written or read) and cuDNN,
# nvidia-smi sampled every 100 ms (scripts/clock-probe.sh). Carry build-cuda/devbin.tar.xz and .peers;
# about 2 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
work=$(mktemp -d)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,clocks.sm,power.draw --format=csv
PROBE_SECONDS=3 OUT=$work/default scripts/clock-probe.sh 32x16x2048x128:full 2x16x8192x128:full 2x16x2048x128:full
echo "default done at $((SECONDS - S0)) s"
PROBE_SECONDS=3 PROBE_DELTA=rounded OUT=$work/rounded scripts/clock-probe.sh 32x16x2048x128:full 2x16x2048x128:full
echo "rounded done at $((SECONDS - S0)) s"
tar -C "$work" -czf "$OUT/power-probe.tar.gz" .
{ echo "## default (recommended δ)"; cat "$work/default/clock-probe.md"; echo; echo "## ours with the rounded δ"; cat "$work/rounded/clock-probe.md"; } >"$OUT/power-probe.md"
cat "$OUT/power-probe.md"

#!/usr/bin/env bash
# On the GPU machine: the kernels of one GPT-2 124M training step (B 16, T 1024), ours and the
# compiled PyTorch peer's, each timed by Nsight Compute (one kernel at a time, no cache flush, the
# clocks left alone), summarized per kernel name (scripts/profile_kernels.py). Sums are serialized
# kernel time: launch gaps and overlaps are not in them, so compare them with `bench train`'s step.
#   STABLEFLASH_DEVBIN=build-cuda/devbin scripts/profile-train.sh      (after scripts/device-check.sh pack)
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${STABLEFLASH_DEVBIN:-build-cuda/devbin}
PEERS=${STABLEFLASH_PEERS:-.peers}
OUT=${OUT:-/tmp/stableflash-profile}
mkdir -p "$OUT"
if [ ! -d "$BIN" ] && [ -f "$BIN.tar.xz" ]; then mkdir -p "$BIN" && tar -C "$BIN" -xJf "$BIN.tar.xz"; fi
. scripts/device-libs.sh && use_device_libraries "$BIN"
ncu_args=(--csv --metrics gpu__time_duration.sum --cache-control none --clock-control none --print-kernel-base function)
# ours: about 500 kernels per step; 1,600 cover three steps from the start
ncu "${ncu_args[@]}" --launch-count ${OURS_KERNELS:-1600} \
  "$BIN"/stableflash bench train --preset gpt2-124m --device cuda --set train.grad_accum=1 ${OURS_ARGS:-} >"$OUT/ours.csv" 2>"$OUT/ours.err"
python3 scripts/profile_kernels.py "$OUT/ours.csv" --step-marker "${OURS_MARKER:-adam}" | tee "$OUT/ours.txt"
# the peer: skip its warm-up (compilation and the first steps), then about three steps
ncu "${ncu_args[@]}" --launch-skip ${PEER_SKIP:-2500} --launch-count ${PEER_KERNELS:-1500} \
  python3 "$PEERS"/torch_peers.py gpt2 --no-bias --steps 10 >"$OUT/peer.csv" 2>"$OUT/peer.err"
python3 scripts/profile_kernels.py "$OUT/peer.csv" --step-marker "${PEER_MARKER:-adam}" | tee "$OUT/peer.txt"

#!/usr/bin/env bash
# The forward's kernel variants side by side on the GPU machine (attention/cuda/lab, docs/benchmarks.md
# "Kernel history"): kernel_lab once per variant over one shape list, in the same call, then a table
# of forward TFLOP/s per shape and variant with each variant's ratio to the first. From the packed
# binaries (`scripts/device-check.sh pack` here). About 1 s per shape and variant on an H200.
#
#   GPU machine:  scripts/forward-lab.sh [VARIANT ...]     # default: production wgmma-1wg wgmma-ws-rounds wgmma-ws-tiles
#   FORWARD_LAB_SHAPES="BxHxTxD:causal|full,..." replaces the shapes; FORWARD_LAB_POLICY (default
#   standard) and FORWARD_LAB_DELTA (default compensated) the options.
# Variants: kernel_lab --forward-kernel's names (production, wgmma-1wg, wgmma-ws, wgmma-ws-rounds,
# wgmma-ws-tiles, wgmma-ws-2c, wgmma-ws-3c, wgmma-serial, mma).
#
# Output: the table on stdout and in $OUT/forward-lab.md, each variant's kernel_lab output in
# $OUT/forward-lab-VARIANT.txt (default OUT=/tmp/stableflash-device); exit status 1 if a run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${STABLEFLASH_DEVBIN:-build-cuda/devbin}
OUT=${OUT:-/tmp/stableflash-device}
mkdir -p "$OUT"
. scripts/device-libs.sh && require_devbin_program "$BIN" kernel_lab && use_device_libraries "$BIN"
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(production wgmma-1wg wgmma-ws-rounds wgmma-ws-tiles)
# The sweep's causal shapes where the schedules differed most, the GPT-2 shape, and full attention
shapes=${FORWARD_LAB_SHAPES:-16x12x1024x64:causal,16x12x1024x64:full,8x16x1000x64:causal,2x16x2048x64:causal,32x16x2048x64:causal,8x16x4097x64:causal,2x16x8192x64:causal,1x8x4097x64:causal,8x16x1000x128:causal,32x16x2048x128:causal,8x16x4096x128:causal,1x8x4097x128:causal,2x16x16384x128:causal,16x12x1024x128:full,2x16x8192x128:full}
status=0
for v in "${variants[@]}"; do
  echo "=== $v ($(date +%T))"
  "$BIN"/kernel_lab --forward-kernel "$v" --shapes "$shapes" --policy "${FORWARD_LAB_POLICY:-standard}" \
    --delta-source "${FORWARD_LAB_DELTA:-compensated}" --windows 5 >"$OUT/forward-lab-$v.txt" 2>&1 || status=1
done
# kernel_lab's rows: "B,H,T,D  mask  numerics  policy  delta  fwd_ms  fwd_TFLOP/s  bwd_ms  bwd_TFLOP/s  check"
{
  echo "Forward TFLOP/s (kernel_lab, policy ${FORWARD_LAB_POLICY:-standard}, δ ${FORWARD_LAB_DELTA:-compensated}); in parentheses the ratio to ${variants[0]}."
  echo
  printf '| shape | mask |'; printf ' %s |' "${variants[@]}"; echo
  printf '|---|---|'; printf -- '---|%.0s' "${variants[@]}"; echo
  for f in "${variants[@]}"; do echo "$OUT/forward-lab-$f.txt"; done |
    xargs awk 'FNR == 1 { file++ } /^[0-9]+,/ { key = $1 " | " $2; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
                                              tf[key, file] = $7 }
               END { for (i = 1; i <= n; i++) { k = order[i]; line = "| " k " |"
                       for (f = 1; f <= file; f++) {
                         if ((k, f) in tf) line = line sprintf(" %.1f", tf[k, f]) (f > 1 && tf[k, 1] > 0 ? sprintf(" (%.2f)", tf[k, f] / tf[k, 1]) : "") " |"
                         else line = line " – |"
                       }
                       print line } }'
} | tee "$OUT/forward-lab.md"
exit $status

#!/usr/bin/env bash
# Forward kernel time at Nsight Compute's locked base clock (cycles, not the power cap's clock):
# ours per packed variant (.ab/NAME) and cuDNN's (SDPA), the median of 3 launches after 2.
# usage: cycles.sh "BxHxTxD:mask,..." NAME...   (PASS=backward for the backward's main kernel)
OUT=${OUT:-/tmp/stableflash-device}
shapes=$1; shift
pass=${PASS:-forward}
[ "$pass" = forward ] && { ok=attention_forward; ck=fprop; } || { ok=attention_backward_wgmma; ck=bprop; }
for v in "$@"; do
  [ -x .ab/$v/stableflash ] || { mkdir -p .ab/$v && tar -C .ab/$v -xJf .ab/$v.tar.xz; } || { echo "cannot unpack .ab/$v.tar.xz"; exit 2; }
done
med() { python3 -c 'import sys,statistics; v=[float(x) for x in sys.stdin.read().split()]; print(f"{statistics.median(v):.1f}" if v else "nan")'; }
dur() { grep '"gpu__time_duration.sum"' | awk -F'","' '{gsub(/[",]/,"",$NF); print $NF}'; }
printf "| shape | %s | cuDNN |\n|---|%s---|\n" "$(IFS='|'; echo "$*" | sed 's/ / | /g')" "$(printf -- '---|%.0s' "$@")"
for s in ${shapes//,/ }; do
  row="| $s |"
  for v in "$@"; do
    ( . scripts/device-libs.sh && use_device_libraries .ab/$v
      ncu --csv --print-units base --metrics gpu__time_duration.sum --kernel-name regex:$ok --launch-skip 2 --launch-count 3 \
        .ab/$v/stableflash bench attention --shapes $s --numerics fused --policy standard --delta-source compensated \
        --warmup 0 --windows 1 --min-window-ms 1 --no-check 2>/dev/null ) | dur | med > /tmp/cyc.txt
    row="$row $(cat /tmp/cyc.txt) |"
  done
  [[ $s =~ ^([0-9]+)x([0-9]+)x([0-9]+)x([0-9]+):(causal|full)$ ]]
  B=${BASH_REMATCH[1]} H=${BASH_REMATCH[2]} T=${BASH_REMATCH[3]} D=${BASH_REMATCH[4]} c=$([ ${BASH_REMATCH[5]} = causal ] && echo True || echo False)
  c_us=$(ncu --csv --print-units base --metrics gpu__time_duration.sum --kernel-name regex:$ck --launch-skip 2 --launch-count 3 python3 -c "
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q, k, v = (torch.randn($B, $H, $T, $D, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(6):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=$c)
        if '$pass' == 'backward': o.backward(torch.randn_like(o))
torch.cuda.synchronize()" 2>/dev/null | dur | med)
  echo "$row $c_us |"
done

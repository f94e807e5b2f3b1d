#!/usr/bin/env bash
# session 34, call 2: the one-warpgroup forward against production's plan on small grids (B·H 8-64,
# T 256-4096, D 64 / 128, full and causal), rounds alternating: production, 1wg, 1wg, production
S0=$SECONDS
[ -d build-cuda/devbin ] || { mkdir -p build-cuda/devbin && tar -C build-cuda/devbin -xJf build-cuda/devbin.tar.xz; } || exit 2
cat build-cuda/devbin/built-from.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SH=
for d in 128 64; do for m in full causal; do for bh in 1x8 1x16 2x16 4x16; do for t in 256 384 512 1024 2048 4096; do
  SH="$SH${SH:+,}${bh}x${t}x${d}:$m"; done; done; done; done
L=build-cuda/devbin/kernel_lab
run() { timeout 150 $L --forward-kernel $1 --shapes "$SH" --policy standard --delta-source compensated --no-check \
          --warmup 0.1 --windows 5 --min-window-ms 10 --json $OUT/grid-$1-$2.jsonl > $OUT/grid-$1-$2.txt 2>&1
        echo "$1 round $2 rc $? at $((SECONDS - S0)) s"; }
run production 1; run wgmma-1wg 1; run wgmma-1wg 2; run production 2
python3 - "$OUT" <<'PY'
import json, sys, collections
out = sys.argv[1]
t = collections.defaultdict(lambda: collections.defaultdict(list))
for k in ("production", "wgmma-1wg"):
    for r in (1, 2):
        try:
            for line in open(f"{out}/grid-{k}-{r}.jsonl"):
                j = json.loads(line)
                t[(j["D"], j["causal"], j["B"] * j["H"], j["T"])][k].append(j["fwd_tflops"])
        except OSError as e: print(e)
print("D mask BH T: production fwd TF/s (2 rounds) | 1wg | ratio 1wg/production")
for key in sorted(t):
    p, w = t[key]["production"], t[key]["wgmma-1wg"]
    if p and w:
        r = (sum(w) / len(w)) / (sum(p) / len(p))
        print(f"{key[0]:3d} {'causal' if key[1] else 'full  '} {key[2]:3d} {key[3]:5d}: {' '.join(f'{x:6.1f}' for x in p)} | {' '.join(f'{x:6.1f}' for x in w)} | {r:.3f}{'  <-- 1wg' if r > 1.02 else ''}")
PY

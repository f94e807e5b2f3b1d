#!/usr/bin/env bash
# One command on the GPU machine: the GPU tests, compute-sanitizer memcheck and racecheck on
# small shapes, and our attention benchmark side by side with the PyTorch peers
# (shared/peers/torch_peers.py; scripts/gqa_sdpa_peer.py for the grouped-query shape) on the
# benchmark shapes, ending with a table of our/peer
# ratios. Logs and JSON go to $OUT (default /tmp/stableflash-device).
#
#   here (no GPU):   scripts/device-check.sh pack     # copies the CUDA build's binaries (the labs too:
#                                                     # scripts/gemm-lab.sh runs gemm_lab; ce_lab and
#                                                     # launch_gap run by hand) to build-cuda/devbin
#                                                     # (and build-cuda/devbin.tar.xz, what travels) and
#                                                     # the peer scripts to .peers
#                    scripts/device-check.sh pack --sweep-only   # the same with stableflash and the wheel
#                                                     # alone (~11 MB against ~31 MB): what the attention
#                                                     # sweep needs, for calls whose carry is near its limit
#   GPU machine:     scripts/device-check.sh [--quick] [--skip-tests] [--skip-sanitizer] [--skip-audit] [--skip-peer-values] [--skip-bench]
#                                              [--skip-train] [--skip-train-bench] [--train-only] [--skip-dist] [--dist-only] [--skip-python] [--python [--full]]
#                                              [--skip-dist-bench] [--dist-bench-only] [--sweep]
# --sweep adds the attention sweep of issue 12 (scripts/attention-sweep.sh --interleaved --graphs, about
# 4.5 minutes: ours through the wheel's PyTorch op and the cuDNN and FA2 peers in one process, window by
# window, over B·H 8-512, T 128-16384, D 64/128, causal and full; docs/benchmarks.md says why that
# method) after the benchmark; scripts/attention-sweep.sh runs it alone.
# The Python part (--python: only it, in its quick mode, about 2 minutes; --python --full: all of it,
# about 10; the whole check runs it full unless --quick): installs the wheel (scripts/build-wheel.sh; pack copies it into
# the devbin) with pip --no-index into a temporary --target folder, then runs tests/python_gpu (opcheck,
# values against SDPA in FP64, torch.compile), the op's cost over the C++ entry point, the nanoGPT-style
# training against SDPA (python/examples/train_gpt.py) and the bias audit of SDPA's backends and the op
# (scripts/audit-torch-peers.sh), ending with a table.
# With two GPUs or more it also checks data-parallel training (--gpus 2 and torchrun against one GPU
# and the CPU, a killed and a stopped rank, resuming on another world size) and times two GPUs.
# The trainer part: the model, optimizer and trainer GPU tests, then `stableflash bench train` beside
# the PyTorch GPT-2 peer (torch_peers.py gpt2, compiled, no biases) with the ratio.
#
# The binaries come from a CUDA build (cmake -S . -B build-cuda -DSTABLEFLASH_CUDA=ON; ninja -C build-cuda),
# so the GPU machine compiles nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${STABLEFLASH_DEVBIN:-build-cuda/devbin}
PEERS=${STABLEFLASH_PEERS:-.peers}

if [ "${1:-}" = "pack" ]; then
  case "${2:-}" in
    "") sweep_only=0 ;;
    --sweep-only) sweep_only=1 ;;
    *) echo "pack: unknown option '$2' (--sweep-only or nothing)" >&2; exit 2 ;;
  esac
  # The peer script is what every comparison on the GPU machine runs (benchmarks, values, the
  # trainer's peer, the audit of PyTorch): a pack without it is no pack.
  peers_src=${STABLEFLASH_PEERS_SRC:-../shared/peers}
  [ -f "$peers_src/torch_peers.py" ] ||
    { echo "pack: $peers_src/torch_peers.py is missing (the PyTorch peer script; STABLEFLASH_PEERS_SRC names its folder)" >&2; exit 1; }
  # a pack holds this build's files only (a sweep-only pack after a full one would carry the full one's
  # binaries along): an earlier pack's folder is emptied, any other folder left alone
  if [ -f "$BIN/built-from.txt" ]; then rm -rf "$BIN"; fi
  mkdir -p "$BIN" "$PEERS"
  # Build first: a pack of stale binaries measures an older tree under the current commit's name. The
  # wheel is rebuilt from the same build (the sweep's --interleaved protocol runs ours through it; a
  # wheel packed earlier once carried older kernels than the binaries beside it).
  ninja -C build-cuda -j "${STABLEFLASH_JOBS:-$(nproc)}" >/dev/null ||
    { echo "pack: the build in build-cuda failed (ninja -C build-cuda)" >&2; exit 1; }
  . scripts/device-libs.sh && require_dependency_records build-cuda || exit 1
  STABLEFLASH_JOBS=${STABLEFLASH_JOBS:-$(nproc)} scripts/build-wheel.sh >/dev/null ||
    { echo "pack: scripts/build-wheel.sh failed" >&2; exit 1; }
  bins="build-cuda/stableflash build-cuda/kernel_lab build-cuda/gemm_lab build-cuda/launch_gap build-cuda/ce_lab build-cuda/tests/attention_gpu/attention_gpu_tests build-cuda/tests/model_gpu/model_gpu_tests
        build-cuda/tests/optim_gpu/optim_gpu_tests build-cuda/tests/train_gpu/train_gpu_tests build-cuda/tests/train_gpu/train_probes_gpu_tests"
  [ $sweep_only = 0 ] || bins=build-cuda/stableflash  # attention-sweep.sh: the program and the wheel
  cp $bins "$BIN"/
  for b in $bins; do strip "$BIN/$(basename "$b")" 2>/dev/null || true; done
  copy_runtime_libraries "$BIN" $bins
  cp "$peers_src"/*.py "$PEERS"/ || { echo "pack: cannot copy the peer scripts to $PEERS" >&2; exit 1; }
  # the Python wheel travels in the same archive (scripts/build-wheel.sh builds it)
  rm -f "$BIN"/stableflash-*.whl
  cp build-cuda/wheel/stableflash-*.whl "$BIN"/
  # The commit the binaries were built from (the GPU machine's copy of the repository may carry an
  # older history): what device.txt and the sweep's table name
  git rev-parse HEAD >"$BIN/built-from.txt" 2>/dev/null || echo unknown >"$BIN/built-from.txt"
  if git status --porcelain --untracked-files=no 2>/dev/null | grep -q .; then echo "uncommitted changes" >>"$BIN/built-from.txt"; fi
  # One archive to carry: the binaries share most of their bytes (the attention kernels), which xz
  # finds (about 18 MB for five binaries of 23 MB each).
  tar -C "$BIN" -cf - . | xz -6 >"$BIN.tar.xz"
  du -sh "$BIN" "$BIN.tar.xz" "$PEERS"
  exit 0
fi

quick=0 tests=1 sanitizer=1 bench=1 audit=1 peer_values=1 train=1 dist=1 train_single=1 train_bench=1 python=1 dist_checks=1 dist_bench=1 sweep=0
python_mode=  # --quick or --full for device-check-python.sh; --python alone: --quick
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --full) python_mode=--full ;;
    --skip-tests) tests=0 ;;
    --skip-sanitizer) sanitizer=0 ;;
    --skip-bench) bench=0 ;;
    --skip-audit) audit=0 ;;
    --skip-peer-values) peer_values=0 ;;
    --skip-train) train=0 ;;
    --skip-train-bench) train_bench=0 ;;  # the trainer's GPU tests without the GPT-2 benchmark and its peer
    --skip-dist) dist=0 ;;
    --dist-only) tests=0 sanitizer=0 bench=0 audit=0 peer_values=0 train_single=0 python=0 ;;
    # The data-parallel part in two calls, for callers with a per-command time limit:
    --skip-dist-bench) dist_bench=0 ;;
    --dist-bench-only) tests=0 sanitizer=0 bench=0 audit=0 peer_values=0 train_single=0 python=0 dist_checks=0 ;;
    --train-only) tests=0 sanitizer=0 bench=0 audit=0 peer_values=0 python=0 ;;
    --skip-python) python=0 ;;
    --sweep) sweep=1 ;;
    --python) tests=0 sanitizer=0 bench=0 audit=0 peer_values=0 train=0 python=1 python_mode=${python_mode:---quick} ;;
    *) echo "unknown argument: $a" >&2; exit 2 ;;
  esac
done
if [ ! -d "$BIN" ] && [ -f "$BIN.tar.xz" ]; then
  mkdir -p "$BIN" && tar -C "$BIN" -xJf "$BIN.tar.xz" || { echo "cannot unpack $BIN.tar.xz" >&2; exit 2; }
fi
OUT=${OUT:-/tmp/stableflash-device}
mkdir -p "$OUT"
. scripts/device-libs.sh && use_device_libraries "$BIN"
export SF_BIN="$PWD/$BIN" SF_PEERS="$PWD/$PEERS"
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/device.txt"
echo "binaries built from $(tr '\n' ' ' 2>/dev/null <"$BIN/built-from.txt" || echo 'an unrecorded commit')" | tee -a "$OUT/device.txt"

if [ $tests = 1 ]; then
  step "GPU tests"
  filter='*'
  [ $quick = 1 ] && filter='-*4097*'
  run_gtests 300 "$OUT/tests.log" "$BIN"/attention_gpu_tests --gtest_filter="$filter" || { echo "GPU tests: exit $?"; status=1; }
fi

if [ $sanitizer = 1 ]; then
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool (small shapes)"
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$BIN"/attention_gpu_tests --gtest_filter="$SANITIZER_CASES" \
      --gtest_brief=1 >"$OUT/sanitizer-$tool.log" 2>&1
    rc=$?
    tail -4 "$OUT/sanitizer-$tool.log"
    [ $rc = 0 ] || { echo "compute-sanitizer $tool: exit $rc"; status=1; }
  done
fi

if [ $audit = 1 ]; then
  # SF_AUDIT_FLAGS: grid flags for both audits; by default the default grid at head dims 64 and 128
  # (the grid's own D = 64 has a power-of-two scale, which never takes the forward's log2-unit scores)
  audit_flags=${SF_AUDIT_FLAGS:---D 64,128}
  step "audit: CPU vs --device cuda (default grid, $audit_flags)"
  "$BIN"/stableflash audit --json $audit_flags >"$OUT/audit-cpu.jsonl" 2>/dev/null || status=1
  "$BIN"/stableflash audit --json --device cuda $audit_flags >"$OUT/audit-cuda.jsonl" 2>/dev/null || status=1
  # the contract's "same conclusions", with the noise floor at FP32's resolution of each case's logits
  python3 scripts/audit_compare.py "$OUT/audit-cpu.jsonl" "$OUT/audit-cuda.jsonl" | tee "$OUT/audit-compare.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ $peer_values = 1 ]; then
  step "identical inputs: ours (fused) vs SDPA flash/cuDNN, errors against the FP64 reference"
  values_dir=$(mktemp -d)  # inputs and outputs stay out of $OUT (they are large)
  PYTHONUNBUFFERED=1 python3 - "$values_dir" <<'EOF' | tee "$OUT/peer-values.txt" || status=1
import json, subprocess, sys, os
import torch
from safetensors.torch import save_file, load_file
out, bin_dir, peers = sys.argv[1], os.environ["SF_BIN"], os.environ["SF_PEERS"]
cases = [((2, 4, 1000, 64), True), ((1, 3, 777, 128), False), ((2, 2, 1025, 128), True)]
failed = 0
for i, (shape, causal) in enumerate(cases):
    g = torch.Generator().manual_seed(100 + i)
    t = {n: torch.randn(shape, generator=g).to(torch.bfloat16) for n in ("q", "k", "v", "do")}
    src = f"{out}/values-{i}.safetensors"
    save_file(t, src)
    flag = ["--causal"] if causal else []
    def run(cmd):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run([f"{bin_dir}/stableflash", "attention", src, "-o", f"{out}/ours-{i}.st", "--device", "cuda"] + flag)
    run([f"{bin_dir}/stableflash", "attention", src, "-o", f"{out}/ref-{i}.st", "--numerics", "reference"] + flag)
    for b in ("flash", "cudnn"):
        run(["python3", f"{peers}/torch_peers.py", "values", "--in", src, "--out", f"{out}/{b}-{i}.st", "--backend", b] + flag)
    ref = load_file(f"{out}/ref-{i}.st")
    res = {name: load_file(f"{out}/{name}-{i}.st") for name in ("ours", "flash", "cudnn")}
    line = f"{shape} {'causal' if causal else 'full'}:"
    for n, factor in (("o", 2.0), ("dq", 3.0), ("dk", 3.0), ("dv", 3.0)):
        r = ref[n].double()
        err = {k: (v[n].double() - r).abs().max().item() for k, v in res.items()}
        mx = r.abs().max().item()
        ulp = 2.0 ** (torch.floor(torch.log2(torch.tensor(mx))).item() - 7)  # BF16 ulp at max|ref|
        ok = err["ours"] <= factor * err["flash"] + ulp  # the peer: SDPA flash (FlashAttention-2)
        failed += not ok
        line += f"  {n}: ours {err['ours']:.3g} flash {err['flash']:.3g} cudnn {err['cudnn']:.3g} {'ok' if ok else 'FAIL'}"
    print(line)
print(f"ours within 2x (forward) / 3x (gradients) SDPA flash's error + 1 ulp: {'yes' if not failed else 'NO'}")
sys.exit(1 if failed else 0)
EOF
  rm -rf "$values_dir"
fi

if [ $bench = 1 ]; then
  step "benchmark: ours"
  # the four multi-head shapes and a grouped-query one (Llama: 64 query heads, 8 KV heads); every
  # measurement, ours and the peers', after 1 s of warm-up, so that both run at the GPU's power cap
  # (scripts/peer_timing.py says why; the peers' first call, where cuDNN builds its plan, untimed)
  export STABLEFLASH_BENCH_WARMUP=${STABLEFLASH_BENCH_WARMUP:-1.0}
  shapes="16x12x1024x64:causal,16x12x1024x64:full,8x16x4096x128:causal,2x16x16384x128:causal,2x64x4096x128:causal:kv8"
  : >"$OUT/ours.jsonl"
  # the default attention (the trainer's, from the library's one definition): what the summary reports
  default_policy=$("$BIN"/stableflash train --print-config | sed -n 's/^attention\.default\.policy=//p')
  default_delta=$("$BIN"/stableflash train --print-config | sed -n 's/^attention\.default\.delta_source=//p')
  echo "default attention: fused, policy ${default_policy:?}, delta_source ${default_delta:?}"
  # both shifts with the default's delta and the rounded one: the default, FlashAttention as is
  # (standard + rounded), and the rest (auto is the compensated delta at these shapes' > 128 keys)
  bench_deltas=rounded,$default_delta
  [ "$default_delta" != rounded ] || bench_deltas=rounded,compensated
  "$BIN"/stableflash bench attention --shapes "$shapes" --numerics fused --policy standard,hashed_offset \
    --delta-source "$bench_deltas" --warmup "$STABLEFLASH_BENCH_WARMUP" --json "$OUT/ours-fused.jsonl" | tee "$OUT/ours-fused.txt" || status=1
  "$BIN"/stableflash bench attention --shapes "16x12x1024x64:causal" --numerics paper --policy standard,paper,hashed_offset \
    --delta-source rounded --warmup "$STABLEFLASH_BENCH_WARMUP" --json "$OUT/ours-paper.jsonl" | tee "$OUT/ours-paper.txt" || status=1
  "$BIN"/stableflash bench attention --shapes "16x12x1024x64:causal,8x16x4096x128:causal" --numerics fused --policy standard \
    --delta-source exact --warmup "$STABLEFLASH_BENCH_WARMUP" --json "$OUT/ours-exact.jsonl" | tee "$OUT/ours-exact.txt" || status=1
  # the comparison kernels live in the kernel lab (attention/cuda/lab), not in the library; a
  # --sweep-only pack has no lab, which the check says (and counts as a failure: rows it promises are missing)
  : >"$OUT/mma-sync-fused.jsonl"; : >"$OUT/one-wg-fused.jsonl"
  if [ ! -x "$BIN/kernel_lab" ]; then
    echo "no $BIN/kernel_lab (a --sweep-only pack?): the comparison kernels' rows (mma.sync, one-warpgroup forward) are not run"
    status=1
  else
    "$BIN"/kernel_lab --forward-kernel mma --backward-kernel mma --shapes "$shapes" --numerics fused --policy standard \
      --delta-source rounded --no-check --json "$OUT/mma-sync-fused.jsonl" | tee "$OUT/mma-sync-fused.txt" || status=1
    sed -i 's/"numerics": "fused"/"numerics": "fused (mma.sync)"/' "$OUT/mma-sync-fused.jsonl"
    # the D = 128 forward without warp specialization (one warpgroup per 64 rows), for comparison; the
    # oracle check also covers that path, which the GPU tests (default kernels) do not take at D = 128
    "$BIN"/kernel_lab --forward-kernel wgmma-1wg --shapes "8x16x4096x128:causal,2x16x16384x128:causal" \
      --numerics fused --policy "$default_policy" --delta-source "$default_delta" --json "$OUT/one-wg-fused.jsonl" | tee "$OUT/one-wg-fused.txt" || status=1
    sed -i 's/"numerics": "fused"/"numerics": "fused (1-warpgroup fwd)"/' "$OUT/one-wg-fused.jsonl"
  fi
  cat "$OUT"/ours-*.jsonl "$OUT/mma-sync-fused.jsonl" "$OUT/one-wg-fused.jsonl" >"$OUT/ours.jsonl"

  step "benchmark: peers (PyTorch SDPA flash = FlashAttention-2, cuDNN)"
  : >"$OUT/peers.jsonl"
  for spec in "16 12 1024 64 --causal" "16 12 1024 64" "8 16 4096 128 --causal" "2 16 16384 128 --causal"; do
    set -- $spec
    PYTHONUNBUFFERED=1 python3 scripts/peer_timing.py --peers "$PEERS" --warmup "$STABLEFLASH_BENCH_WARMUP" -- \
      attention --B "$1" --H "$2" --T "$3" --D "$4" ${5:-} --backends flash,cudnn 2>>"$OUT/peers.err" | tail -1 >>"$OUT/peers.jsonl" || status=1
  done
  # grouped-query heads: torch_peers.py has no such mode; our script calls SDPA with enable_gqa=True
  # through torch_peers.py's own timing function
  PYTHONUNBUFFERED=1 python3 scripts/gqa_sdpa_peer.py --peers "$PEERS" --warmup "$STABLEFLASH_BENCH_WARMUP" --B 2 --H 64 --Hkv 8 --T 4096 --D 128 --causal \
    --backends flash,cudnn 2>>"$OUT/peers.err" | tail -1 >>"$OUT/peers.jsonl" || status=1

  step "ratios (ours / peer, same run)"
  python3 - "$OUT/ours.jsonl" "$OUT/peers.jsonl" "$default_policy" "$default_delta" <<'EOF' | tee "$OUT/table.md"
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peers = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
default_policy, default_delta = sys.argv[3], sys.argv[4]
def peer(o, name):
    for p in peers:
        if (p["B"], p["H"], p.get("Hkv", p["H"]), p["T"], p["D"], p["causal"]) == \
                (o["B"], o["H"], o.get("Hkv", o["H"]), o["T"], o["D"], o["causal"]):
            return p.get(name, {})
    return {}
print("| shape (B,H,T,D) | mask | numerics | policy | delta | ours fwd | ours bwd | FA2 fwd | FA2 bwd | fwd/FA2 | bwd/FA2 | cuDNN fwd | cuDNN bwd | fwd/cuDNN | bwd/cuDNN | check |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for o in ours:
    f, c = peer(o, "flash"), peer(o, "cudnn")
    def r(a, p, k):
        return f"{a / p[k]:.2f}" if k in p and p[k] else "-"
    def v(p, k):
        return f"{p[k]:.0f}" if k in p else "-"
    heads = f"{o['H']}/{o['Hkv']}" if o.get("Hkv", o["H"]) != o["H"] else f"{o['H']}"
    print(f"| {o['B']},{heads},{o['T']},{o['D']} | {'causal' if o['causal'] else 'full'} | {o['numerics']} | {o['policy']} | "
          f"{o['delta_source']} | {o['fwd_tflops']:.0f} | {o['bwd_tflops']:.0f} | {v(f, 'fwd_tflops')} | {v(f, 'bwd_tflops')} | "
          f"{r(o['fwd_tflops'], f, 'fwd_tflops')} | {r(o['bwd_tflops'], f, 'bwd_tflops')} | {v(c, 'fwd_tflops')} | "
          f"{v(c, 'bwd_tflops')} | {r(o['fwd_tflops'], c, 'fwd_tflops')} | {r(o['bwd_tflops'], c, 'bwd_tflops')} | {o['check']} |")

# The summary: the default against the peers, and what its parts cost, shape by shape (the fused
# wgmma rows only). The cure's cost is the default's delta against the rounded one under the
# default's shift; the shift's cost is the other shift against the default's, both with its delta.
def key(o):
    return (o["B"], o["H"], o.get("Hkv", o["H"]), o["T"], o["D"], o["causal"])
fused = {(key(o), o["policy"], o["delta_source"]): o for o in ours if o["numerics"] == "fused"}
shapes = list(dict.fromkeys(key(o) for o in ours if o["numerics"] == "fused"))
def label(k):
    heads = f"{k[1]}/{k[2]}" if k[2] != k[1] else f"{k[1]}"
    return f"{k[0]},{heads},{k[3]},{k[4]} {'causal' if k[5] else 'full'}"
def pct(a, b, field):  # time of a over time of b, from TFLOP/s of the same shape
    return f"{100 * (b[field] / a[field] - 1):+.1f}%" if a and b else "-"
other = "hashed_offset" if default_policy == "standard" else "standard"
other_delta = "rounded" if default_delta != "rounded" else "compensated"
print()
print(f"Default attention (fused, {default_policy}, {default_delta} delta) and what its parts cost, "
      "time relative to the row it is compared with:")
print()
print(f"| shape | default fwd/FA2 | bwd/FA2 | fwd/cuDNN | bwd/cuDNN | cure: {default_delta} vs {other_delta} delta ({default_policy}), fwd / bwd "
      f"| shift: {other} vs {default_policy} ({default_delta}), fwd / bwd |")
print("|---|---|---|---|---|---|---|")
for k in shapes:
    d = fused.get((k, default_policy, default_delta))
    if not d:
        continue
    f, c = peer(d, "flash"), peer(d, "cudnn")
    rnd = fused.get((k, default_policy, other_delta))
    alt = fused.get((k, other, default_delta))
    def r(a, p, fld):
        return f"{a / p[fld]:.2f}" if fld in p and p[fld] else "-"
    print(f"| {label(k)} | {r(d['fwd_tflops'], f, 'fwd_tflops')} | {r(d['bwd_tflops'], f, 'bwd_tflops')} | "
          f"{r(d['fwd_tflops'], c, 'fwd_tflops')} | {r(d['bwd_tflops'], c, 'bwd_tflops')} | "
          f"{pct(d, rnd, 'fwd_tflops')} / {pct(d, rnd, 'bwd_tflops')} | {pct(alt, d, 'fwd_tflops')} / {pct(alt, d, 'bwd_tflops')} |")
EOF
fi

if [ $sweep = 1 ]; then
  step "attention sweep (scripts/attention-sweep.sh; its table and archive in $OUT/attention-sweep.*)"
  OUT="$OUT" STABLEFLASH_DEVBIN="$BIN" STABLEFLASH_PEERS="$PEERS" scripts/attention-sweep.sh --interleaved --graphs || status=1
fi

if [ $train = 1 ] && [ $train_single = 1 ]; then
  for suite in model_gpu_tests optim_gpu_tests train_gpu_tests train_probes_gpu_tests; do
    step "GPU tests: $suite"
    run_gtests 300 "$OUT/$suite.log" "$BIN/$suite" || { echo "$suite: exit $?"; tail -30 "$OUT/$suite.log"; status=1; }
  done

  if [ $train_bench = 1 ]; then
  step "benchmark: training GPT-2 124M, B 16, T 1024 (ours, then the PyTorch peer)"
  : >"$OUT/train-bench.jsonl"
  for det in true false; do
    "$BIN"/stableflash bench train --preset gpt2-124m --device cuda --set train.grad_accum=1 --set train.deterministic=$det \
      --json "$OUT/train-bench.jsonl" || status=1
  done
  # the same step without CUDA graphs (train.cuda_graph, on by default), for the graphs' gain in the same call
  "$BIN"/stableflash bench train --preset gpt2-124m --device cuda --set train.grad_accum=1 --set train.cuda_graph=false \
    --json "$OUT/train-bench.jsonl" || status=1
  PYTHONUNBUFFERED=1 python3 "$PEERS"/torch_peers.py gpt2 --B 16 --T 1024 --steps 30 --no-bias 2>>"$OUT/peers.err" | tail -1 \
    >"$OUT/train-peer.json" || status=1
  cat "$OUT/train-peer.json"
  python3 - "$OUT/train-bench.jsonl" "$OUT/train-peer.json" <<'EOF' | tee "$OUT/train-table.md"
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peer = json.loads(open(sys.argv[2]).read())
print("| GPT-2 124M, B 16, T 1024 | ms/step | tokens/s | peak GiB | MFU | tokens/s vs peer | memory vs peer |")
print("|---|---|---|---|---|---|---|")
for o in ours:
    print(f"| stableflash (deterministic={o['deterministic']}, CUDA graph={o.get('cuda_graph', False)}) | {o['ms_per_step']:.2f} | {o['tokens_per_s']:.0f} | "
          f"{o['peak_mem_gib']:.2f} | {100 * o['mfu']:.1f}% | {o['tokens_per_s'] / peer['tokens_per_s']:.3f}x | "
          f"{o['peak_mem_gib'] / peer['peak_mem_gib']:.2f}x |")
print(f"| PyTorch (compile={peer['compile']}, sdpa {peer['sdpa']}, bias={peer['bias']}) | {peer['ms_per_step']:.2f} | "
      f"{peer['tokens_per_s']:.0f} | {peer['peak_mem_gib']:.2f} | | 1.000x | 1.00x |")
EOF
  fi
fi

gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ $train = 1 ] && [ $dist = 1 ] && [ "$gpus" -ge 2 ]; then
  W=$(mktemp -d)
  data=${STABLEFLASH_DATA:-$PWD/.deps/corpus/shards}
  # the default corpus travels packed (carry .deps/corpus-pack/shards.tar.xz, as for device-experiments.sh)
  if [ ! -d "$data" ] && [ -z "${STABLEFLASH_DATA:-}" ] && [ -f .deps/corpus-pack/shards.tar.xz ]; then
    mkdir -p .deps/corpus && tar -C .deps/corpus -xJf .deps/corpus-pack/shards.tar.xz
  fi
  [ -d "$data" ] || echo "no corpus at $data: carry .deps/corpus-pack/shards.tar.xz or set STABLEFLASH_DATA (the checks below will fail)"
  common=(--preset tiny --quiet --set data.dir="$data" --set train.grad_accum=2 --set train.val_every=10 --set train.checkpoint_every=10)
  if [ $dist_checks = 1 ]; then  # (the body keeps the indentation of the block: it holds here-documents)
  step "data parallel: CPU, one GPU, --gpus 2 and torchrun on the same 20 steps ($data)"
  "$BIN"/stableflash train "${common[@]}" --device cpu --steps 20 --run-dir "$W/cpu" || status=1
  "$BIN"/stableflash train "${common[@]}" --device cuda --steps 20 --run-dir "$W/g1" || status=1
  # The two-rank runs compared with each other bit for bit below run deterministic: otherwise each
  # process times cuBLASLt's candidates at first use and may pick another algorithm (and the
  # attention backward adds dQ parts in arrival order where a query block has several key blocks),
  # so equal losses would be luck (2026-11-30: the same binaries printed True, then False, for ZeRO-1
  # against all-reduce).
  same=(--set train.deterministic=true)
  timeout 120 "$BIN"/stableflash train "${common[@]}" "${same[@]}" --gpus 2 --steps 20 --run-dir "$W/g2" || { echo "--gpus 2 failed"; status=1; }
  timeout 120 torchrun --standalone --nproc-per-node 2 --no-python "$BIN"/stableflash train "${common[@]}" --steps 20 \
    --run-dir "$W/torchrun" >"$OUT/torchrun.log" 2>&1 || { echo "torchrun launch failed"; tail -20 "$OUT/torchrun.log"; status=1; }
  # ZeRO-1 (the default above) against plain all-reduce, and ZeRO-1 with 1 MB buckets (about 29 of
  # them on the tiny model, so reductions overlap the backward and gathers the forward).
  timeout 120 "$BIN"/stableflash train "${common[@]}" "${same[@]}" --gpus 2 --steps 20 --set dist.zero_stage=0 --run-dir "$W/g2-allreduce" ||
    { echo "--gpus 2 with dist.zero_stage=0 failed"; status=1; }
  timeout 120 "$BIN"/stableflash train "${common[@]}" "${same[@]}" --gpus 2 --steps 20 --set dist.bucket_mb=1 --run-dir "$W/g2-buckets" ||
    { echo "--gpus 2 with dist.bucket_mb=1 failed"; status=1; }
  # ZeRO-1 against all-reduce again with two micro-batches per rank (accumulated, reduced on the last
  # only) and under Muon (its matrices in replicated buckets).
  for v in accum4:train.grad_accum=4 muon:optim.name=muon; do
    for stage in 1 0; do
      timeout 120 "$BIN"/stableflash train "${common[@]}" "${same[@]}" --gpus 2 --steps 20 --set "${v#*:}" --set dist.zero_stage=$stage \
        --run-dir "$W/g2-${v%%:*}-stage$stage" || { echo "--gpus 2 with ${v#*:}, dist.zero_stage=$stage failed"; status=1; }
    done
  done
  python3 - "$W" <<'EOF' | tee "$OUT/dist-agreement.txt" || status=1
import json, math, sys
w = sys.argv[1]
def losses(run):
    return [json.loads(l)["loss"] for l in open(f"{w}/{run}/metrics.jsonl") if l.strip()]
cpu, g1 = losses("cpu"), losses("g1")
ulp = lambda x: 2.0 ** (math.floor(math.log2(abs(x))) - 7)
# Two ranks differ from one GPU only in the order gradients are summed (FP32). The bound: twice the
# one-GPU run's own distance from the FP32 CPU trainer (the BF16 error, running maximum) + one ulp.
bad = 0
for name in ("g2", "torchrun", "g2-allreduce", "g2-buckets"):
    other = losses(name)
    assert len(other) == len(g1) == len(cpu) == 20, f"{name}: {len(other)} steps"
    naive = worst = 0.0
    for s, (c, a, b) in enumerate(zip(cpu, g1, other)):
        naive = max(naive, abs(a - c))
        bound = 2 * naive + ulp(c)
        worst = max(worst, abs(b - a) / bound)
        if abs(b - a) > bound:
            bad += 1
            print(f"{name} step {s}: one GPU {a}, two ranks {b}, bound {bound:.3g}")
    print(f"{name}: 20 steps, largest |two ranks - one GPU| / bound = {worst:.3f}; identical to one GPU: {other == g1}")
# Two ranks sum each gradient as a + b under either scheme; only the gradient norm's FP64 order differs.
print("ZeRO-1 losses identical to all-reduce:", losses("g2") == losses("g2-allreduce"),
      "; with 1 MB buckets:", losses("g2-buckets") == losses("g2"))
for name, what in (("accum4", "2 micro-batches per rank"), ("muon", "Muon")):
    try:
        print(f"ZeRO-1 losses identical to all-reduce, {what}:", losses(f"g2-{name}-stage1") == losses(f"g2-{name}-stage0"))
    except OSError as e:
        print(f"ZeRO-1 against all-reduce, {what}: missing run ({e})")
print("two ranks within the bound:", "yes" if not bad else "NO")
sys.exit(1 if bad else 0)
EOF

  step "data parallel: a two-rank (ZeRO-1) checkpoint resumes on one GPU and on the CPU; a one-GPU one on two ranks"
  cp -r "$W/g2" "$W/g2-cpu"
  "$BIN"/stableflash train --quiet --run-dir "$W/g2" --resume --steps 25 --device cuda && tail -1 "$W/g2/metrics.jsonl" || status=1
  "$BIN"/stableflash train --quiet --run-dir "$W/g2-cpu" --resume --steps 22 --device cpu && tail -1 "$W/g2-cpu/metrics.jsonl" || status=1
  timeout 120 "$BIN"/stableflash train --quiet --run-dir "$W/g1" --resume --steps 25 --gpus 2 && tail -1 "$W/g1/metrics.jsonl" || status=1

  step "data parallel: ZeRO-1 with train.deterministic resumes bit for bit on two ranks"
  det=("${common[@]}" --set train.deterministic=true --set dist.bucket_mb=1)
  timeout 120 "$BIN"/stableflash train "${det[@]}" --gpus 2 --steps 20 --run-dir "$W/det-straight" || status=1
  timeout 120 "$BIN"/stableflash train "${det[@]}" --gpus 2 --steps 10 --run-dir "$W/det-resumed" || status=1
  timeout 120 "$BIN"/stableflash train --quiet --run-dir "$W/det-resumed" --resume --steps 20 --gpus 2 || status=1
  python3 - "$W" <<'EOF' || status=1
import json, sys
w = sys.argv[1]
a, b = ([json.loads(l)["loss"] for l in open(f"{w}/{r}/metrics.jsonl") if l.strip()] for r in ("det-straight", "det-resumed"))
print(f"20 steps straight vs 10 + resume 10 on two ranks: {len(a)} and {len(b)} steps, identical: {a == b}")
sys.exit(0 if a == b and len(a) == 20 else 1)
EOF

  step "data parallel: Ctrl-C finishes the step on every rank, checkpoints once, exits 130; --resume goes on"
  long=(--preset tiny --quiet --set data.dir="$data" --set train.grad_accum=2 --steps 100000 --set train.val_every=0 --set train.checkpoint_every=0)
  "$BIN"/stableflash train "${long[@]}" --gpus 2 --run-dir "$W/sigint" >"$OUT/sigint.log" 2>&1 &
  launcher=$!
  sleep 12
  kill -INT $launcher
  timeout 60 tail --pid=$launcher -f /dev/null; wait $launcher; rc=$?
  echo "launcher exit $rc:"; cat "$OUT/sigint.log"; ls "$W/sigint/checkpoints"
  { [ $rc = 130 ] && [ -f "$W/sigint/checkpoints/latest" ]; } || { echo "FAIL: no clean stop on SIGINT"; status=1; }
  stopped=$(tail -1 "$W/sigint/metrics.jsonl" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step"] + 1)')
  timeout 60 "$BIN"/stableflash train --quiet --run-dir "$W/sigint" --resume --steps $((stopped + 5)) --gpus 2 &&
    echo "resumed from step $stopped to $((stopped + 5))" || { echo "FAIL: resume after SIGINT"; status=1; }

  step "data parallel: a killed rank ends the run, named"
  "$BIN"/stableflash train "${long[@]}" --gpus 2 --run-dir "$W/kill" >"$OUT/kill.log" 2>&1 &
  launcher=$!
  sleep 12
  victim=$(pgrep -P $launcher | tail -1)
  t0=$(date +%s); kill -9 "$victim"
  timeout 60 tail --pid=$launcher -f /dev/null; wait $launcher; rc=$?
  echo "launcher exit $rc after $(( $(date +%s) - t0 )) s:"; cat "$OUT/kill.log"
  { [ $rc != 0 ] && grep -q "rank 1" "$OUT/kill.log"; } || { echo "FAIL: the killed rank was not reported"; status=1; }

  step "data parallel: a stopped (hung) rank ends the run within STABLEFLASH_HANG_TIMEOUT"
  STABLEFLASH_HANG_TIMEOUT=15 "$BIN"/stableflash train "${long[@]}" --gpus 2 --run-dir "$W/hang" >"$OUT/hang.log" 2>&1 &
  launcher=$!
  sleep 12
  victim=$(pgrep -P $launcher | tail -1)
  t0=$(date +%s); kill -STOP "$victim"
  timeout 90 tail --pid=$launcher -f /dev/null; wait $launcher; rc=$?
  echo "launcher exit $rc after $(( $(date +%s) - t0 )) s:"; cat "$OUT/hang.log"
  { [ $rc != 0 ] && grep -q "no rank made progress" "$OUT/hang.log"; } || { echo "FAIL: the hang was not reported"; status=1; }
  kill -9 "$victim" 2>/dev/null
  fi  # dist_checks

  if [ $dist_bench = 1 ]; then
  step "benchmark: GPT-2 124M on two GPUs (B 16 per GPU) against one"
  : >"$OUT/dist-bench.jsonl"
  "$BIN"/stableflash bench train --preset gpt2-124m --device cuda --set train.grad_accum=1 --json "$OUT/dist-bench.jsonl" || status=1
  timeout 240 "$BIN"/stableflash bench train --preset gpt2-124m --gpus 2 --set train.grad_accum=2 --json "$OUT/dist-bench.jsonl" || status=1
  timeout 240 "$BIN"/stableflash bench train --preset gpt2-124m --gpus 2 --set train.grad_accum=2 --set dist.zero_stage=0 \
    --json "$OUT/dist-bench.jsonl" || status=1
  # the token embedding split off (dist.split_embedding, docs/training.md): wte reduced whole after the backward, as before it
  timeout 240 "$BIN"/stableflash bench train --preset gpt2-124m --gpus 2 --set train.grad_accum=2 --set dist.split_embedding=false \
    --json "$OUT/dist-bench.jsonl" || status=1
  python3 - "$OUT/dist-bench.jsonl" <<'EOF' | tee "$OUT/dist-table.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
one = next(r for r in rows if r["ranks"] == 1)
for r in rows:
    scheme = "" if r["ranks"] == 1 else (", ZeRO-1" if r.get("zero_stage", 1) == 1 else ", all-reduce")
    if r["ranks"] > 1 and not r.get("split_embedding", True):
        scheme += ", wte unsplit"
    peaks = " / ".join(f"{p:.2f}" for p in r.get("peak_mem_gib_per_rank", [r["peak_mem_gib"]]))
    waits = " / ".join(f"{100 * x:.1f}%" for x in r.get("communication_wait_share_per_rank", [0.0]))
    print(f"| {r['ranks']} GPU(s){scheme} | B {r['B']} x accumulation {r['grad_accum']} | {r['ms_per_step']:.2f} ms/step | "
          f"{r['tokens_per_s']:.0f} tokens/s | {r['tokens_per_s'] / one['tokens_per_s']:.3f}x one GPU | peak {peaks} GiB | "
          f"waiting on communication {waits} |")
EOF
  fi  # dist_bench
  rm -rf "$W"
fi

if [ $python = 1 ]; then
  [ -n "$python_mode" ] || python_mode=$([ $quick = 1 ] && echo --quick || echo --full)
  scripts/device-check-python.sh "$BIN" "$OUT" "$python_mode" || status=1
fi

step "done (status $status); logs in $OUT"
exit $status

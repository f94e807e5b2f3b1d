#!/usr/bin/env bash
# Builds the Python wheel (docs/python.md): the C ABI library libstableflash_c.so from the CUDA build
# (build-cuda, sm_90a kernels; configured here if it is not yet), then python/build_wheel.py packs it
# with the package into build-cuda/wheel/stableflash-VERSION-py3-none-linux_x86_64.whl. No torch and
# no network needed. On the GPU machine: pip install --no-index --target DIR that wheel.
#
#   scripts/build-wheel.sh [BUILD_DIR]        # default build-cuda
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
if [ ! -f "$build/build.ninja" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$build" -G Ninja -DSTABLEFLASH_CUDA=ON "${launcher[@]}" >/dev/null
fi
ninja -C "$build" -j "${STABLEFLASH_JOBS:-$(nproc)}" stableflash_c
grep -qE '^CMAKE_CUDA_COMPILER:[A-Z]+=/' "$build/CMakeCache.txt" ||
  echo "warning: $build has no CUDA kernels; this wheel runs on the CPU only" >&2
lib="$build/capi/libstableflash_c.so"
# the wheel carries the library without its symbol table (a third of the size; the exports stay)
stripped="$build/wheel-lib/libstableflash_c.so"
mkdir -p "$(dirname "$stripped")"
strip --strip-unneeded -o "$stripped" "$lib"
# The OpenMP runtime (the CPU path's) travels in the wheel: PyTorch's copy has a hashed name, and a
# minimal image may lack libgomp1. The CUDA runtime does not: PyTorch for CUDA 13 has loaded it.
extra=()
gomp=$(ldd "$lib" | awk '$1 == "libgomp.so.1" {print $3}')
if [ -n "$gomp" ]; then
  cp -L "$gomp" "$build/wheel-lib/libgomp.so.1"
  extra=(--with-lib "$build/wheel-lib/libgomp.so.1")
fi
rm -f "$build"/wheel/stableflash-*.whl
python3 python/build_wheel.py --lib "$stripped" --out "$build/wheel" "${extra[@]}"

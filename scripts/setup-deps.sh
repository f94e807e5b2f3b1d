#!/usr/bin/env bash
# Installs what building and testing stableflash needs, once: Debian packages through apt-get
# (only those missing) and PyPI packages into the project-local folder .deps/python.
set -euo pipefail
cd "$(dirname "$0")/.."

debian_packages=(
  build-essential cmake ninja-build pkg-config python3 python3-pip
  libgtest-dev libgmock-dev            # tests
  nlohmann-json3-dev libcli11-dev       # JSON (safetensors headers, metrics), command line
  libtomlplusplus-dev                   # trainer config files
  libpcre2-dev libzstd-dev              # tokenizer pattern, compressed corpora
)

missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# CuTe/CUTLASS headers (the Hopper kernels' building blocks) from PyPI's nvidia-cutlass, into the
# project-local .deps/python; CMake finds them there (cmake/StableflashCuda.cmake). Never fetched
# at build time. Only CUDA builds can use them, so a failure here is a warning.
cutlass_version=4.2.0.0
if [ ! -f .deps/python/cutlass_library/source/include/cute/tensor.hpp ]; then
  echo "setup: installing nvidia-cutlass==$cutlass_version (CuTe headers) into .deps/python"
  python3 -m pip install -q --no-deps --target .deps/python "nvidia-cutlass==$cutlass_version" 2>/dev/null ||
    python3 -m pip install -q --no-deps --break-system-packages --target .deps/python "nvidia-cutlass==$cutlass_version" ||
    echo "setup: warning: could not install nvidia-cutlass; CUDA kernels that need CuTe will be unavailable" >&2
fi

#!/usr/bin/env bash
# Installs what building and testing stableflash needs, once: Debian packages through apt-get
# (only those missing) and PyPI packages into the project-local folder .deps/python.
set -euo pipefail
cd "$(dirname "$0")/.."

debian_packages=(
  build-essential cmake ninja-build pkg-config python3 python3-pip
  libgtest-dev libgmock-dev            # tests
  libeigen3-dev                        # tests: the full SVD the spectral-norm probe is checked against
  nlohmann-json3-dev libcli11-dev       # JSON (safetensors headers, metrics), command line
  libtomlplusplus-dev                   # trainer config files
  libpcre2-dev libzstd-dev              # tokenizer pattern, compressed corpora
  clang libclang-rt-dev                 # libFuzzer targets (tests/fuzz): the runtime is only "recommended"
  chromium                              # tests: the report page is opened in a real headless browser
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

# --- PyPI, project-local (never the system's site-packages) -------------------------------------
# tiktoken is the tokenizer tests' peer (tests/peers/tiktoken_peer.py); pinned so CI compares
# against the version the exactness claims in docs/tokenizer.md were measured with.
mkdir -p .deps
python_deps=.deps/python
# --target keeps everything in the project folder, so the distribution's externally-managed marker
# (PEP 668) does not apply; pip is told so, and not to warn about running as root.
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore
tiktoken_version=0.14.0
if ! PYTHONPATH="$python_deps" python3 -c "import tiktoken, sys; sys.exit(tiktoken.__version__ != '$tiktoken_version')" 2>/dev/null; then
  echo "setup: installing tiktoken==$tiktoken_version into $python_deps"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$python_deps" --upgrade "tiktoken==$tiktoken_version"
fi

# matplotlib draws `stableflash report`'s plots (scripts/report/); pinned so the pictures, and the
# tests that check them, do not change under us. Its wheels bring numpy, pillow and the rest.
matplotlib_version=3.10.8
if ! PYTHONPATH="$python_deps" python3 -c "import matplotlib, sys; sys.exit(matplotlib.__version__ != '$matplotlib_version')" 2>/dev/null; then
  echo "setup: installing matplotlib==$matplotlib_version into $python_deps"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$python_deps" --upgrade "matplotlib==$matplotlib_version"
fi

# GPT-2's ranks file in tiktoken format, read at run time by the tokenizer (never downloaded at
# run time). It ships in the openai-whisper source distribution as whisper/assets/gpt2.tiktoken;
# the hash pins the exact file (50256 ranks) every exactness claim was measured with.
ranks=.deps/gpt2.tiktoken
ranks_sha256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
whisper_version=20250625
if ! echo "$ranks_sha256  $ranks" | sha256sum --check --status 2>/dev/null; then
  echo "setup: fetching GPT-2's ranks file from the openai-whisper==$whisper_version source distribution"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    --dest "$tmp" "openai-whisper==$whisper_version"
  tar -xzf "$tmp"/openai_whisper-*.tar.gz -C "$tmp" --wildcards '*/whisper/assets/gpt2.tiktoken'
  got=$(sha256sum "$tmp"/openai_whisper-*/whisper/assets/gpt2.tiktoken | cut -d' ' -f1)
  if [ "$got" != "$ranks_sha256" ]; then
    echo "setup: error: gpt2.tiktoken from openai-whisper==$whisper_version has sha256 $got, expected $ranks_sha256" >&2
    exit 1
  fi
  cp "$tmp"/openai_whisper-*/whisper/assets/gpt2.tiktoken "$ranks.tmp" && mv "$ranks.tmp" "$ranks"
fi

# CuTe/CUTLASS headers (the CUDA kernels' instruction wrappers are built on them) from PyPI's
# nvidia-cutlass, into the project-local .deps/python; CMake finds them there
# (cmake/StableflashCuda.cmake). Never fetched at build time. Only CUDA builds need them, so a
# failure here is a warning; a CUDA build then stops at configure time, saying so.
cutlass_version=4.2.0.0
if [ ! -f .deps/python/cutlass_library/source/include/cute/tensor.hpp ]; then
  echo "setup: installing nvidia-cutlass==$cutlass_version (CuTe headers) into .deps/python"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$python_deps" "nvidia-cutlass==$cutlass_version" ||
    echo "setup: warning: could not install nvidia-cutlass; a CUDA build (nvcc present) will fail to configure" >&2
fi

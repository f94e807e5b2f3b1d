#!/usr/bin/env bash
# The loops of one kernel object's device code and what one pass through each issues, by opcode
# (scripts/sass_loops.py), on this machine without a GPU: the object's own nvcc command from
# build-cuda (ninja -t commands), its output turned into a cubin, disassembled by nvdisasm.
#
#   scripts/sass-count.sh OBJECT FUNCTION_REGEX [NVCC_FLAG ...]
#   e.g. scripts/sass-count.sh attention/CMakeFiles/sf_attention.dir/cuda/backward_fused_hd64.cu.o delta_exact_kernel
#        scripts/sass-count.sh ... delta_exact_kernel -DSTABLEFLASH_EXACT_POLY_EVERY=0
# OBJECT: an object of build-cuda, as ninja names it; extra flags are added to its nvcc command (a -D
# to count another variant). nvdisasm is not in this machine's CUDA toolkit: the first run fetches
# PyPI's nvidia-cuda-nvdisasm into .deps/nvdisasm (pip download, no install). Output: the table on
# stdout; the cubin and the listing stay in $SASS_DIR (default a temporary folder, removed).
set -euo pipefail
cd "$(dirname "$0")/.."
object=${1:?usage: scripts/sass-count.sh OBJECT FUNCTION_REGEX [NVCC_FLAG ...]}
function=${2:?usage: scripts/sass-count.sh OBJECT FUNCTION_REGEX [NVCC_FLAG ...]}
shift 2
command=$(ninja -C build-cuda -t commands "$object" 2>/dev/null | tail -1 || true)
[[ "$command" == *nvcc* && "$command" == *" -c "* ]] || { echo "sass-count: no nvcc command for $object in build-cuda (ninja -t commands)" >&2; exit 2; }

nvdisasm=.deps/nvdisasm/nvidia/cu13/bin/nvdisasm
if [ ! -x "$nvdisasm" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps -q -d "$tmp" nvidia-cuda-nvdisasm >&2 || { echo "sass-count: cannot fetch nvidia-cuda-nvdisasm from PyPI" >&2; exit 2; }
  mkdir -p .deps/nvdisasm && python3 -m zipfile -e "$tmp"/*.whl .deps/nvdisasm && rm -rf "$tmp"
  chmod +x "$nvdisasm"
fi

dir=${SASS_DIR:-}
[ -n "$dir" ] || { dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT; }
mkdir -p "$dir"
# the object's command without its dependency file and output, compiled to a cubin instead
read -r -a words <<<"$command"
args=()
for ((i = 0; i < ${#words[@]}; ++i)); do
  case "${words[i]}" in
    -MD) ;;
    -MT | -MF | -o) ((++i)) ;;
    -c) ;;
    --ptxas-options=--warn-on-spills) ;;
    *) args+=("${words[i]}") ;;
  esac
done
(cd build-cuda && "${args[@]}" "$@" -cubin -o "$dir/kernel.cubin") 2>"$dir/nvcc.log" || { cat "$dir/nvcc.log" >&2; exit 2; }
"$nvdisasm" -c "$dir/kernel.cubin" >"$dir/kernel.sass"
python3 scripts/sass_loops.py "$dir/kernel.sass" "$function"

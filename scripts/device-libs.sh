# Sourced by the scripts that run the packed programs on the GPU machine, from the repository root
# (and by the packing steps here, for copy_runtime_libraries):
#   . scripts/device-libs.sh && use_device_libraries "$BIN"
# (require_devbin_program below first, for a script that runs one packed program)
# puts on LD_LIBRARY_PATH the devbin's own libraries, the CUDA toolkit's and the GPU image's
# cuBLASLt, NCCL and CUDA runtime (the nvidia-* wheels beside PyTorch: the versions the binaries
# were seen running with). Once: a script called by another that did it leaves the path alone.
use_device_libraries() {
  local bin=$1 image_libs
  [[ ":${LD_LIBRARY_PATH:-}:" == *":$PWD/$bin:"* ]] && return 0
  image_libs=$(python3 -c 'import nvidia, os; r = os.path.dirname(nvidia.__path__[0]); print(":".join(os.path.join(r, "nvidia", d, "lib") for d in ("cublas", "nccl", "cu13")))' 2>/dev/null)
  export LD_LIBRARY_PATH="$PWD/$bin:/usr/local/cuda/lib64${image_libs:+:$image_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# The attention GPU tests that compute-sanitizer's memcheck and racecheck run (device-check.sh,
# attention-ab.sh): small shapes, whose walks are too short to reuse a buffer from block to block
# (on longer walks racecheck reports hazards, most of them hand-overs it does not model and 8 in the
# deterministic dQ still open: docs/benchmarks.md, "The racecheck probe"); and the forward of 140
# heads whose persistent CTAs each take several short tiles (EveryHeadGetsTheBits: the K/V ring, Q
# and the staging tiles reused from tile to tile; clean under both tools, H100, 2026-12-07).
SANITIZER_CASES='*Tq17Tk17*:*Tq97Tk300*:*Tq300Tk97*:*Tq200Tk77*:*Tq150Tk200*:*Tq128Tk260*:*FullyMasked*:*Tq1Tk1*:*EventCounters*:*EveryHeadGetsTheBits*'

# Runs a googletest program ("$@") for at most $1 seconds, its whole output in $2: without
# --gtest_brief, so that the log has a line for every test started and a hang names its test (a
# candidate kernel that deadlocks otherwise costs the whole limit and says nothing). Prints the
# summary and failure lines, and on a timeout the test that was running. Returns the program's exit
# status (124: it ran out of time).
run_gtests() {
  local limit=$1 log=$2 rc
  shift 2
  timeout "$limit" "$@" >"$log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED)|tests ran|golden" "$log" | tail -40
  [ $rc = 124 ] && echo "timed out after $limit s in $(grep '^\[ RUN' "$log" | tail -1 | sed 's/^\[ RUN *\] //')"
  return $rc
}

# Copies into $dest the shared libraries the programs link that the GPU image may lack (CUDA
# runtime, toml++, pcre2, zstd, OpenMP); the C and C++ runtimes there are newer than ours and stay
# the system's, and cuBLAS(Lt) and NCCL (hundreds of MB) come from the image (CUDA 13).
copy_runtime_libraries() {
  local dest=$1 bin
  shift
  for bin in "$@"; do
    ldd "$bin" | awk '$3 ~ /^\// {print $3}' |
      grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
      grep -vE '/lib(cublas|cublasLt|nccl)\.so' |
      while read -r lib; do cp -L "$lib" "$dest"/; done
  done
}

# A pack's binaries are only as new as the headers its objects were rebuilt for. Ninja knows an
# object's headers from its dependency record; an interrupted or concurrent ninja run in the same tree
# can leave an object with none ("#deps 0" in `ninja -t deps`), and then a header change no longer
# rebuilds it (seen 2026-12-07: the head dim 128 backward kept the kernel from before an edit of
# backward_wgmma_kernel.cuh). Returns 1, naming the objects and the remedy, if any compiled object of
# the build tree $1 has no record.
require_dependency_records() {
  local build=$1 missing
  missing=$(ninja -C "$build" -t deps 2>/dev/null | grep -E '\.o: #deps 0,' | cut -d: -f1) || true
  [ -z "$missing" ] && return 0
  echo "pack: these objects of $build have no dependency record, so a header change would not rebuild them:" >&2
  echo "$missing" | sed 's/^/  /' >&2
  echo "  touch their sources (build-cuda/attention/cuda/*.cu for the generated ones) and rebuild before packing" >&2
  return 1
}

# Unpacks $bin.tar.xz (what device-check.sh pack makes and what travels) into $bin unless
# $bin/$program is there already; ends the script, naming what to build, if it is still missing.
require_devbin_program() {
  local bin=$1 program=$2
  if [ ! -x "$bin/$program" ] && [ -f "$bin.tar.xz" ]; then
    mkdir -p "$bin" && tar -C "$bin" -xJf "$bin.tar.xz" || { echo "cannot unpack $bin.tar.xz" >&2; exit 2; }
  fi
  [ -x "$bin/$program" ] ||
    { echo "no $bin/$program: build it (ninja -C build-cuda $program) and run scripts/device-check.sh pack" >&2; exit 2; }
}

# Installs the Python wheel (scripts/build-wheel.sh; device-check.sh pack puts it in the devbin)
# into the folder $target without network and puts that folder on PYTHONPATH; sets `wheel` and `how`
# (pip, or unzipped where the image has no pip: a wheel is a zip laid out as installed). Logs to
# $log. Returns 1, saying why, if there is no wheel or it would not install.
install_wheel() {
  local bin=$1 target=$2 log=$3
  wheel=$(ls "$bin"/stableflash-*.whl build-cuda/wheel/stableflash-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ]; then
    echo "no stableflash-*.whl in $bin or build-cuda/wheel (here: scripts/build-wheel.sh, then scripts/device-check.sh pack)"
    return 1
  fi
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip install --no-index --no-deps --target "$target" "$wheel" >"$log" 2>&1 ||
      { cat "$log"; echo "pip install failed"; return 1; }
    how="pip install --no-index --target"
  else
    python3 -m zipfile -e "$wheel" "$target" >"$log" 2>&1 || { cat "$log"; return 1; }
    how="unzipped (no pip here)"
  fi
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
}

# Unpacks each packed variant NAME (.ab/NAME.tar.xz, `scripts/attention-ab.sh pack NAME`) into .ab/NAME
# unless it is there already (attention-ab.sh, attention-cycles.sh). Exits the calling script (2)
# naming the pack that is missing or cannot be unpacked.
unpack_ab_variants() {
  local v
  for v in "$@"; do
    [ -x ".ab/$v/stableflash" ] && continue
    [ -f ".ab/$v.tar.xz" ] || { echo "no .ab/$v.tar.xz: scripts/attention-ab.sh pack $v (here) and carry .ab" >&2; exit 2; }
    mkdir -p ".ab/$v" && tar -C ".ab/$v" -xJf ".ab/$v.tar.xz" || { echo "cannot unpack .ab/$v.tar.xz" >&2; exit 2; }
  done
}

# A packed variant's checks (the experiments' device scripts): its attention GPU tests, then
# compute-sanitizer memcheck and racecheck on SANITIZER_CASES and the googletest
# filter $2 (the experiment's own tests). Logs in $OUT/{tests,memcheck,racecheck}-NAME.log, their
# summary lines on stdout with the seconds since S0.
variant_tests_and_sanitizers() {
  local v=$1 extra=$2 tool
  ( use_device_libraries ".ab/$v" && timeout 120 ".ab/$v/attention_gpu_tests" ) >"$OUT/tests-$v.log" 2>&1
  echo "tests rc $? at $((SECONDS - ${S0:-0})) s"; grep -E "PASSED|FAILED|tests ran|Failure|SKIPPED" "$OUT/tests-$v.log" | tail -8
  for tool in memcheck racecheck; do
    ( use_device_libraries ".ab/$v" && timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ".ab/$v/attention_gpu_tests" \
        --gtest_filter="$extra:$SANITIZER_CASES" --gtest_brief=1 ) >"$OUT/$tool-$v.log" 2>&1
    echo "$tool rc $? at $((SECONDS - ${S0:-0})) s"; grep -E "SUMMARY|PASSED|FAILED" "$OUT/$tool-$v.log" | tail -3
  done
}

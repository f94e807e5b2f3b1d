#!/usr/bin/env bash
# The review's mends checked: the attention GPU tests (plan_on_this_device now resolves the options and
# takes cuda::multiprocessors) and the lab's timeline with its tile rows. Carry .ab/review47.tar.xz
# (`scripts/attention-ab.sh pack review47`); about a minute and a half.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants review47 && echo "review47: $(tr '\n' ' ' < .ab/review47/built-from.txt)"
( use_device_libraries .ab/review47 && timeout 150 .ab/review47/attention_gpu_tests ) > "$OUT/tests-review47.log" 2>&1
echo "tests rc $? at $((SECONDS - S0)) s"; grep -E "SplitLastRound|PairedLoneBlocks|PASSED|FAILED|Failure" "$OUT/tests-review47.log" | tail -8
( use_device_libraries .ab/review47 && timeout 40 .ab/review47/kernel_lab --forward-timeline --timeline-shapes 2x16x2048x128:full ) > "$OUT/timeline-review47.txt" 2>&1
echo "timeline rc $? at $((SECONDS - S0)) s"; grep -E "^###|^production|period \(|epilogue \(|tile span|beyond its steps" "$OUT/timeline-review47.txt"

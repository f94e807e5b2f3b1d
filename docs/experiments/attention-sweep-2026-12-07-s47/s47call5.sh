#!/usr/bin/env bash
# The attention GPU tests at this HEAD (tests47: the split-round and paired-lone-block tests ask
# plan_forward for their grids). Carry .ab/tests47.tar.xz (`scripts/attention-ab.sh pack tests47 --no-lab`);
# about a minute.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants tests47 && echo "tests47: $(tr '\n' ' ' < .ab/tests47/built-from.txt)"
( use_device_libraries .ab/tests47 && timeout 150 .ab/tests47/attention_gpu_tests ) > "$OUT/tests-tests47.log" 2>&1
echo "tests rc $? at $((SECONDS - S0)) s"; grep -E "SplitLastRound|PairedLoneBlocks|PASSED|FAILED|Failure" "$OUT/tests-tests47.log" | tail -8

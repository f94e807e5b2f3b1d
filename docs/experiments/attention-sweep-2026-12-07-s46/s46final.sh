#!/usr/bin/env bash
# The forty-sixth session's last call: main's attention GPU tests and the small sanitizer cases on the
# producer clean-up's build (.ab/cleanup, `scripts/attention-ab.sh pack cleanup --no-lab`), then the
# whole sweep of the same build (build-cuda/devbin.tar.xz from `scripts/device-check.sh pack
# --sweep-only`; docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh). Carry .ab,
# build-cuda/devbin.tar.xz and .peers; about 8 minutes.
OUT=${OUT:-/tmp/stableflash-device}; mkdir -p "$OUT"; S0=$SECONDS
. scripts/device-libs.sh && unpack_ab_variants cleanup
echo "cleanup: $(tr '\n' ' ' < .ab/cleanup/built-from.txt)"
variant_tests_and_sanitizers cleanup "*PairedLoneBlocks*"
# S46_HEAD_DIMS="64": the D = 64 half alone (the pairs changed D = 64 shapes only), for a short device budget
SWEEP_HEAD_DIMS=${S46_HEAD_DIMS:-128 64} bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh
echo "done at $((SECONDS - S0)) s"

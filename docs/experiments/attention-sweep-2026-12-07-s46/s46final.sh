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
bash docs/experiments/attention-sweep-2026-12-06-s38/s38sweep.sh
echo "done at $((SECONDS - S0)) s"

#!/usr/bin/env bash
# session 40, call 2 (on the warm machine after s39call4.sh): main40's exact δ pass alone at the locked clock at
# the four D = 128 shapes against main39, then the exact backward's A/B at the two longest ones
# (carry .ab, .peers; .ab/main39 = 88324d0, .ab/main40 = 3f14f04)
timeout 100 scripts/attention-cycles.sh --exact-delta 1x8x16384x128:full,2x16x16384x128:causal,8x16x4096x128:causal,32x16x2048x128:full main39 main40 2>&1 | tail -12
AB_DELTA=exact AB_SHAPES=1x8x16384x128:full,2x16x16384x128:causal timeout 120 scripts/attention-ab.sh main39 main40 >/dev/null 2>&1; cat $OUT/attention-ab.md

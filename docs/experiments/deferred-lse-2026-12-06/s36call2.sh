#!/usr/bin/env bash
# session 36, call 2: the deferred lse and hand-over candidates against main's build (main36 = 24f2c8f):
# dlse3 (lse taken in the staging's row loop, stored in the next tile's first S; step 0 apart),
# dlse4 (the same, step 0 in the loop), dlse6 (also the fence and the store warp's hand-over
# deferred there; step 0 apart), dlse5 (the same, step 0 in the loop); bytes and the A/B
S0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 560 scripts/attention-ab.sh --bits main36 dlse3 dlse4 dlse5 dlse6 > $OUT/ab.txt 2>&1
echo "ab rc $? at $((SECONDS - S0)) s"; grep -E "failed|DIFFERENT" $OUT/ab.txt | head -24
grep -c 'same bytes' $OUT/ab.txt

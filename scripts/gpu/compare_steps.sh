#!/usr/bin/env bash
# Whole training steps of the bundle's hybridcp against the base kept by scripts/gpu/keep_base.sh,
# in the same call on the same GPU (timings from other calls or cards do not compare): tiny, 350m
# and micro at s = 8192, each binary in turn, with tiny's time per kernel kind (and 350m's, new
# binary only); on a GPU with more than 100 GiB (an H200) also the full step with AdamW (both
# binaries) and s = 131072 with --recompute (new binary only). Output in $OUT/steps.txt.
#   run(command="scripts/gpu/compare_steps.sh", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/build-gpu/bundle
LOG=${OUT:-/tmp}/compare_steps.log
source "$ROOT/scripts/gpu/common.sh"
P=$BUNDLE/plans
TXT=${OUT:-/tmp}/steps.txt
NEW=$BUNDLE/bin/hybridcp
unpack_base
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$TXT"
bench() {
  echo "== $*" | tee -a "$TXT"
  timeout 300 "$@" 2>&1 | grep -E "^step|tokens/s/GPU|GPU memory|loss:|AdamW|optimizer|^  [a-z_.]+ +[0-9.]+ ms" |
    tee -a "$TXT"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
for plan in tiny-8192-bf16.plan 350m-8192-bf16.plan micro-8192-bf16.plan; do
  for bin in "$NEW" $BASE; do
    profile=""
    [ "$plan" = tiny-8192-bf16.plan ] && profile=--profile
    bench "$bin" bench "$P/$plan" --steps 8 --warmup 2 $profile
  done
done
# 350m's time per kernel kind (the profile's events replace its CUDA graph: slower steps).
bench "$NEW" bench "$P/350m-8192-bf16.plan" --steps 3 --warmup 1 --profile
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mem" -gt 102400 ]; then
  for bin in "$NEW" $BASE; do
    bench "$bin" bench "$P/tiny-8192-bf16.plan" --steps 6 --warmup 1 --optimizer
  done
  bench "$NEW" bench "$P/tiny-131072-bf16-recompute.plan" --steps 2 --warmup 1
fi
exit $status

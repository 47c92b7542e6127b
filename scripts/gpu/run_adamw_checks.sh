#!/usr/bin/env bash
# The optimizer's kernels on a GPU: AdamW and the gradients' sums of squares against the CPU
# (bit-identical / 1e-6), then timed on 50M elements and on a model's mix of tensors in one
# launch; on a GPU with more than 100 GiB (an H200) also tiny's full step with AdamW, the bundle's
# hybridcp and the base kept by keep_base.sh in turn.
#   run(command="scripts/gpu/run_adamw_checks.sh", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/build-gpu/bundle
LOG=${OUT:-/tmp}/adamw_checks.log
source "$ROOT/scripts/gpu/common.sh"
P=$BUNDLE/plans

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
run "$BUNDLE/bin/test_kernels_cuda" --filter adamw
run "$BUNDLE/bin/test_kernels_cuda" --filter sum_of_squares
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mem" -gt 102400 ]; then
  unpack_base
  for bin in "$BUNDLE/bin/hybridcp" $BASE; do
    run "$bin" bench "$P/tiny-8192-bf16.plan" --steps 6 --warmup 1 --optimizer
  done
fi
exit $status

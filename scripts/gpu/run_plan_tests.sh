#!/usr/bin/env bash
# Whole plans on one GPU: the CUDA backend against the CPU backend, then the benchmarks of
# docs/performance.md. Runs on a GPU machine from a bundle built on the development machine by
# scripts/gpu/make_bundle.sh (the GPU machines have no Abseil or MLIR: binaries, their shared
# libraries and the compiled plans travel together).
#
#   scripts/gpu/run_plan_tests.sh [BUNDLE]     (default: build-gpu/bundle)
#   run(command="scripts/gpu/run_plan_tests.sh", carry=["build-gpu/carry"])  (the packed bundle)
#
# 1. test_plan_step: the bf16 plan of tests/configs/granite-gpu-small.json on the GPU against
#    the f32 plan on the CPU, same initial weights and tokens: loss and every gradient.
# 2. hybridcp bench: granite-4.0-h-tiny shape at s = 8192 on one GPU, forward + backward with
#    the per-kernel breakdown (also without the kept expert h, and on real text), then 20 steps
#    with AdamW on real text (the loss must go down); then with activation recomputation at
#    s = 8192, 65536 and 131072.
# Output goes to stdout and, when $OUT is set, to $OUT/plan_tests.log.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=${1:-$ROOT/build-gpu/bundle}
LOG=${OUT:-/tmp}/plan_tests.log
source "$ROOT/scripts/gpu/common.sh"

nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
for name in small-300 small-512; do  # (small-512x1 is for the training runs: no f32 twin)
  run "$BUNDLE/bin/test_plan_step" "$BUNDLE/plans/$name-bf16.plan" "$BUNDLE/plans/$name-f32.plan"
done
if [ "${SKIP_FWD_BWD_BENCH:-0}" != 1 ]; then
  run "$BUNDLE/bin/hybridcp" bench "$BUNDLE/plans/tiny-8192-bf16.plan" --steps 5 --warmup 2 --profile
  # Without the kept expert h (hcp-keep-expert-h), and on real text (the experts' routing and the
  # embedding's hot rows differ from random tokens').
  run "$BUNDLE/bin/hybridcp" bench "$BUNDLE/plans/tiny-8192-bf16-recompute-expert-h.plan" \
    --steps 5 --warmup 2
  run "$BUNDLE/bin/hybridcp" bench "$BUNDLE/plans/tiny-8192-bf16.plan" --data "$BUNDLE/text.bin" \
    --steps 5 --warmup 2 --profile
fi
run "$BUNDLE/bin/hybridcp" bench "$BUNDLE/plans/tiny-8192-bf16.plan" --data "$BUNDLE/text.bin" \
  --steps 20 --warmup 0 --optimizer --lr 3e-4
for seq in 8192 65536 131072; do
  run "$BUNDLE/bin/hybridcp" bench "$BUNDLE/plans/tiny-$seq-bf16-recompute.plan" --steps 3 --warmup 1
done
exit $status

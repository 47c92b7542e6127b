#!/usr/bin/env bash
# One GPU: the runtime through its Executor interface, and the same step before and after a
# runtime change.
# 1. `hybridcp run-step` on the GPU: the bf16 plan of the gpu-shapes fixture against
#    transformers' fp32 loss and gradients (the fixture), from the command line; --verbose lists
#    every gradient's error. Tolerances: the loss test_plan_step's 5e-5 (measured 1.7e-5); the
#    gradients one bound for all, the MoE side's (test_plan_step's MoeTolerance: transformers
#    routes on its own, and 0.33% of the tokens pick other experts in bf16; the router's 3.1e-2
#    + 2 sqrt(2 f) = 2.13e-1, rounded up; measured worst 1.54e-1, the layer-2 router, every
#    other gradient at most 6.2e-2).
# 2. test_plan_step on the small plans (the per-family GPU parity).
# 3. Before/after: `hybridcp bench` of granite-4.0-h-tiny at s = 8192 with the previous bundle
#    (BEFORE, the packed bundle of the commit before the change, carried as build-gpu/before) and
#    this one, alternating, each on its own plan: the step losses must agree, the tokens/s within
#    noise. (Across a plan schema change the new binary cannot read the old plans: it is then
#    not run on them.)
# 4. Before/after: `hybridcp train` on the GPU with both binaries, one run with --grad-accum 2
#    (the fp32 accumulation stash) and checkpoints, one stopped and resumed: the step losses
#    within 1e-4 (the default attention backward adds dq's pieces in a varying order), the resumed
#    run's as the uninterrupted one's.
#
#   run(command="scripts/gpu/run_executor_checks.sh", carry=["build-gpu/carry", "build-gpu/before"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=${1:-$ROOT/build-gpu/bundle}
LOG=${OUT:-/tmp}/executor_checks.log
source "$ROOT/scripts/gpu/common.sh"
HCP=$BUNDLE/bin/hybridcp
P=$BUNDLE/plans
FIX=$ROOT/tests/fixtures/gpu-shapes

nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
run "$HCP" run-step "$P/gpu-shapes-bf16.plan" --weights "$FIX" --inputs "$FIX/reference.safetensors" \
  --compare "$FIX" --loss-tolerance "${LOSS_TOL:-5e-5}" --grad-tolerance "${GRAD_TOL:-2.2e-1}" --verbose
for name in small-300 small-512; do
  run "$BUNDLE/bin/test_plan_step" "$P/$name-bf16.plan" "$P/$name-f32.plan"
done

BEFORE=$ROOT/build-gpu/before/bundle
if [ -f "$ROOT/build-gpu/before/bundle.tar.gz" ]; then
  rm -rf "$BEFORE" && tar -C "$ROOT/build-gpu/before" -xzf "$ROOT/build-gpu/before/bundle.tar.gz"
  for round in 1 2; do
    run "$BEFORE/bin/hybridcp" bench "$BEFORE/plans/tiny-8192-bf16.plan" --steps 5 --warmup 2
    run "$HCP" bench "$P/tiny-8192-bf16.plan" --steps 5 --warmup 2
  done
  if cmp -s "$BEFORE/plans/tiny-8192-bf16.plan" "$P/tiny-8192-bf16.plan"; then
    echo "== the plans are byte-identical" | tee -a "$LOG"
  elif [ "$(head -c 12 "$BEFORE/plans/tiny-8192-bf16.plan" | od -An -tu1 -j8)" = \
    "$(head -c 12 "$P/tiny-8192-bf16.plan" | od -An -tu1 -j8)" ]; then
    run "$HCP" bench "$BEFORE/plans/tiny-8192-bf16.plan" --steps 5 --warmup 2
  fi
  T=/tmp/hcp-executor-train
  rm -rf "$T" && mkdir -p "$T"
  COMPARE=$ROOT/tests/lit/e2e/Inputs/compare_metrics.py
  for who in BEFORE BUNDLE; do
    dir=${!who}
    TRAIN=(train "$dir/plans/small-512-bf16.plan" --data "$dir/text.bin" --steps 8 --lr 1e-3
      --warmup 0)
    run "$dir/bin/hybridcp" "${TRAIN[@]}" --grad-accum 2 --checkpoint-dir "$T/$who.accum" \
      --checkpoint-every 4 --metrics "$T/$who.accum.jsonl"
    run "$dir/bin/hybridcp" "${TRAIN[@]}" --checkpoint-dir "$T/$who.ck" --checkpoint-every 2 \
      --stop-after 4 --metrics "$T/$who.resumed.jsonl"
    run "$dir/bin/hybridcp" "${TRAIN[@]}" --checkpoint-dir "$T/$who.ck" --resume \
      --metrics "$T/$who.resumed.jsonl"
  done
  run python3 "$COMPARE" "$T/BEFORE.accum.jsonl" "$T/BUNDLE.accum.jsonl" 1 8 1e-4
  run python3 "$COMPARE" "$T/BEFORE.resumed.jsonl" "$T/BUNDLE.resumed.jsonl" 1 8 1e-4
fi
exit $status

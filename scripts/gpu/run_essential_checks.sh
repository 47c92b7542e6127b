#!/usr/bin/env bash
# The few GPU checks that matter most, in about three minutes of one GPU (for a session with
# little device time left; run_pending_checks.sh runs all of them): the GEMM and MoE experts
# kernels (gemm_add's beta, the experts' dout_scale), the gradients' sums of squares, the SSD
# scan's kernels on their small shapes (against the CPU oracle, then timed), the transformers
# fixtures gpu-shapes-packed and gpu-shapes (bf16 plans on the GPU against them and the f32 CPU),
# then tiny at s = 8192 with its kernel profile and with --documents one document per row.
#   run(command="scripts/gpu/run_essential_checks.sh", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/build-gpu/bundle
LOG=${OUT:-/tmp}/essential_checks.log
source "$ROOT/scripts/gpu/common.sh"
HCP=$BUNDLE/bin/hybridcp
P=$BUNDLE/plans

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
run "$BUNDLE/bin/test_kernels_cuda" --small --filter gemm
run "$BUNDLE/bin/test_kernels_cuda" --small --filter moe_experts
run "$BUNDLE/bin/test_kernels_cuda" --filter sum_of_squares
run "$BUNDLE/bin/test_sequence_kernels" --only ssd --no-large
for name in gpu-shapes-packed gpu-shapes; do
  F=$ROOT/tests/fixtures/$name
  plan=${name/-packed/-docs}
  run "$BUNDLE/bin/test_plan_step" "$P/$plan-bf16.plan" "$P/$plan-f32.plan" --weights "$F" \
    --inputs "$F/reference.safetensors" --reference "$F/reference.safetensors"
done
run "$HCP" bench "$P/tiny-8192-bf16.plan" --steps 4 --warmup 1 --profile
run "$HCP" bench "$P/tiny-8192-bf16-docs.plan" --steps 4 --warmup 1
exit $status

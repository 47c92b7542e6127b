#!/usr/bin/env bash
# One GPU: the checks of the CUDA changes of late, in parts (PART="checks speed" fits
# one call, PART=long another; a call cut short by its limit still brings back the log).
# checks: AdamW over every parameter in one launch and the gradients' sums of squares in two
#   launches (bit-identical to the CPU, at unaligned offsets too); gemm_add's beta and the
#   experts' backward's dout_scale (the MoE block's residual multiplier folded in, bit-identical
#   to a dout scaled first); attention with packed
#   documents on the Hopper kernels (and the deterministic mode) against the CPU kernels; the
#   transformers fixtures gpu-shapes-packed and gpu-shapes (hcp-slice-gemms,
#   hcp-fuse-norm-residual) bf16 on the GPU against them and the f32 CPU.
# speed: tiny at s = 8192 (with its kernel profile) and with --documents one document per row;
#   350m with and without the graph.
# long: 350m with the optimizer; tiny at s = 65536 with --recompute keeping attention's output
#   and with --recompute-attention.
#   On an H200 also `bench plans/tiny-8192-bf16.plan --optimizer` (AdamW's time in the full
#   step) and s = 131072 (`bench plans/tiny-131072-bf16-recompute{,-attn}.plan`).
#
#   run(command="PART='checks speed' scripts/gpu/run_pending_checks.sh",
#       carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=${1:-$ROOT/build-gpu/bundle}
LOG=${OUT:-/tmp}/pending_checks.log
source "$ROOT/scripts/gpu/common.sh"
HCP=$BUNDLE/bin/hybridcp
P=$BUNDLE/plans
FIX=$ROOT/tests/fixtures/gpu-shapes-packed

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
PART=${PART:-checks speed long}
part() { [[ " $PART " == *" $1 "* ]]; }
if part checks; then
  run "$BUNDLE/bin/test_kernels_cuda" --filter adamw
  run "$BUNDLE/bin/test_kernels_cuda" --filter sum_of_squares
  run "$BUNDLE/bin/test_kernels_cuda" --filter rms_norm
  run "$BUNDLE/bin/test_kernels_cuda" --small --filter gemm
  run "$BUNDLE/bin/test_kernels_cuda" --small --filter moe_experts
  run "$BUNDLE/bin/test_sequence_kernels" --only attn --no-large
  HCP_ATTN_IMPL=hopper-det run "$BUNDLE/bin/test_sequence_kernels" --only attn --no-large --no-timing
  run "$BUNDLE/bin/test_plan_step" "$P/gpu-shapes-docs-bf16.plan" "$P/gpu-shapes-docs-f32.plan" \
    --weights "$FIX" --inputs "$FIX/reference.safetensors" --reference "$FIX/reference.safetensors"
  SHAPES=$ROOT/tests/fixtures/gpu-shapes
  run "$BUNDLE/bin/test_plan_step" "$P/gpu-shapes-bf16.plan" "$P/gpu-shapes-f32.plan" \
    --weights "$SHAPES" --inputs "$SHAPES/reference.safetensors" \
    --reference "$SHAPES/reference.safetensors"
  run "$BUNDLE/bin/test_plan_step" "$P/small-512-bf16.plan" "$P/small-512-f32.plan"
fi
if part speed; then
  # One document per row with --documents; the step as a CUDA graph and not.
  run "$HCP" bench "$P/tiny-8192-bf16.plan" --steps 5 --warmup 2 --profile
  run "$HCP" bench "$P/tiny-8192-bf16-docs.plan" --steps 5 --warmup 2
  HCP_CUDA_GRAPHS=0 run "$HCP" bench "$P/350m-8192-bf16.plan" --steps 10 --warmup 2
  run "$HCP" bench "$P/350m-8192-bf16.plan" --steps 10 --warmup 2
fi
if part long; then
  run "$HCP" bench "$P/350m-8192-bf16.plan" --steps 5 --warmup 1 --optimizer
  run "$HCP" bench "$P/tiny-65536-bf16-recompute-attn.plan" --steps 2 --warmup 1
  run "$HCP" bench "$P/tiny-65536-bf16-recompute.plan" --steps 2 --warmup 1
fi
exit $status

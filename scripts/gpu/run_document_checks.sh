#!/usr/bin/env bash
# One GPU: packed documents (compile --documents) on the CUDA kernels. The CPU backend's side is
# tests/lit/e2e/packed-documents.test.
#   1. the kernels against the CPU kernels with positions: the conv and the SSD log-decay
#      (test_kernels_cuda), the SSD scan, its segment summary and initial-state correction and
#      attention (test_sequence_kernels, small shapes, rows of uneven documents);
#   2. whole plans: bf16 on the GPU against f32 on the CPU (test_plan_step's tolerances), the small
#      model and the fixture's shapes with rows of documents of 1, 2, 3, 40, 9, 200, 1, 44 ...
#      tokens; the transformers fixture gpu-shapes-packed (each document run alone);
#   3. the cost: tiny at s = 8192 with one document per row against the plan without
#      --documents (and with 8 documents of 1,024 tokens), and at s = 65536 with 64 documents of 1,024 tokens against one document
#      (attention's share from the profile), and the attention kernels alone (s = 65536).
#
#   run(command="scripts/gpu/run_document_checks.sh", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=${1:-$ROOT/build-gpu/bundle}
LOG=${OUT:-/tmp}/document_checks.log
source "$ROOT/scripts/gpu/common.sh"
HCP=$BUNDLE/bin/hybridcp
P=$BUNDLE/plans

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
# 1. The kernels.
run "$BUNDLE/bin/test_kernels_cuda" --small --no-timing --filter causal_conv1d
run "$BUNDLE/bin/test_kernels_cuda" --small --no-timing --filter ssd_log_decay
run "$BUNDLE/bin/test_sequence_kernels" --no-large --no-timing
# 2. Whole plans.
run "$BUNDLE/bin/test_plan_step" "$P/small-512-docs-bf16.plan" "$P/small-512-docs-f32.plan"
run "$BUNDLE/bin/test_plan_step" "$P/gpu-shapes-docs-bf16.plan" "$P/gpu-shapes-docs-f32.plan"
FIX=$ROOT/tests/fixtures/gpu-shapes-packed
run "$BUNDLE/bin/test_plan_step" "$P/gpu-shapes-docs-bf16.plan" "$P/gpu-shapes-docs-f32.plan" \
  --weights "$FIX" --inputs "$FIX/reference.safetensors" --reference "$FIX/reference.safetensors"
# 3. The cost.
run "$HCP" bench "$P/tiny-8192-bf16.plan" --steps 5 --warmup 2
run "$HCP" bench "$P/tiny-8192-bf16-docs.plan" --steps 5 --warmup 2
run "$HCP" bench "$P/tiny-8192-bf16-docs.plan" --steps 5 --warmup 2 --document-length 1024
run "$HCP" bench "$P/tiny-65536-bf16-docs-recompute.plan" --steps 2 --warmup 1 --profile
run "$HCP" bench "$P/tiny-65536-bf16-docs-recompute.plan" --steps 2 --warmup 1 --profile \
  --document-length 1024
run "$BUNDLE/bin/test_sequence_kernels" --only attn --no-large
exit $status

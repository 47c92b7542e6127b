#!/usr/bin/env bash
# The few GPU checks that matter most for what waits to land, in about four minutes of one GPU
# (for a session with little device time left; run_pending_checks.sh runs all of them):
# the RMSNorm backward with the residual added, the transformers fixtures gpu-shapes-packed and
# gpu-shapes (bf16 plans on the GPU against them and the f32 CPU), AdamW's kernels, then tiny at
# s = 8192 (with its kernel
# profile) and with --documents one document per row. Makes the hybrid-moe-packed fixture
# meanwhile on four of the host's cores, into $OUT/fixture.tar.
#   run(command="scripts/gpu/run_essential_checks.sh", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/build-gpu/bundle
LOG=${OUT:-/tmp}/essential_checks.log
source "$ROOT/scripts/gpu/common.sh"
HCP=$BUNDLE/bin/hybridcp
P=$BUNDLE/plans

mkdir -p /tmp/fx
(OMP_NUM_THREADS=4 taskset -c 12-15 python3 "$ROOT/tests/fixtures/make_fixtures.py" /tmp/fx \
  hybrid-moe-packed > "${OUT:-/tmp}/fixture.log" 2>&1
 tar -C /tmp/fx -cf "${OUT:-/tmp}/fixture.tar" .) &
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
run "$BUNDLE/bin/test_kernels_cuda" --filter rms_norm
for name in gpu-shapes-packed gpu-shapes; do
  F=$ROOT/tests/fixtures/$name
  plan=${name/-packed/-docs}
  run "$BUNDLE/bin/test_plan_step" "$P/$plan-bf16.plan" "$P/$plan-f32.plan" --weights "$F" \
    --inputs "$F/reference.safetensors" --reference "$F/reference.safetensors"
done
run "$BUNDLE/bin/test_kernels_cuda" --filter adamw
wait
run "$HCP" bench "$P/tiny-8192-bf16.plan" --steps 4 --warmup 1 --profile
run "$HCP" bench "$P/tiny-8192-bf16-docs.plan" --steps 4 --warmup 1
exit $status

#!/usr/bin/env bash
# One GPU: whole bf16 plans against the CPU f32 plan and transformers with test_plan_step's
# per-family tolerances, then `hybridcp train` on the GPU through what a careless user does to a
# checkpoint directory (the CUDA trainer's side of tests/lit/e2e/checkpoint-dir.test and
# checkpoint-data.test): a stopped and resumed run repeats the uninterrupted one, a new run into
# the directory is refused with every file kept, a damaged latest checkpoint falls back to the
# previous one, NaN weights are refused; and a short bench of granite-4.0-h-tiny at s = 8192.
#
#   scripts/gpu/run_train_checks.sh [BUNDLE]      (after scripts/gpu/make_bundle.sh)
#   run(command="scripts/gpu/run_train_checks.sh", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=${1:-$ROOT/build-gpu/bundle}
LOG=${OUT:-/tmp}/train_checks.log
source "$ROOT/scripts/gpu/common.sh"
HCP=$BUNDLE/bin/hybridcp
P=$BUNDLE/plans
FIX=$ROOT/tests/fixtures/gpu-shapes
INPUTS=$ROOT/tests/lit/e2e/Inputs

for name in small-300 small-512; do
  run "$BUNDLE/bin/test_plan_step" "$P/$name-bf16.plan" "$P/$name-f32.plan"
done
run "$BUNDLE/bin/test_plan_step" "$P/gpu-shapes-bf16.plan" "$P/gpu-shapes-f32.plan" \
  --weights "$FIX" --inputs "$FIX/reference.safetensors" --reference "$FIX/reference.safetensors"

T=/tmp/hcp-train-checks
rm -rf "$T" && mkdir -p "$T"
TRAIN=(train "$P/small-512-bf16.plan" --data "$BUNDLE/text.bin" --steps 8 --lr 1e-3 --warmup 0)
run "$HCP" "${TRAIN[@]}" --checkpoint-dir "$T/full" --checkpoint-every 4 --metrics "$T/full.jsonl"
run "$HCP" "${TRAIN[@]}" --checkpoint-dir "$T/ck" --checkpoint-every 2 --stop-after 4 \
  --metrics "$T/resumed.jsonl"
run "$HCP" "${TRAIN[@]}" --checkpoint-dir "$T/ck" --resume --metrics "$T/resumed.jsonl"
# Within 1e-4: the default attention backward adds dq's pieces in a varying order.
run python3 "$INPUTS/compare_metrics.py" "$T/full.jsonl" "$T/resumed.jsonl" 5 8 1e-4
(cd "$T/ck" && find . -type f | sort | xargs md5sum) >"$T/ck.md5"
expect_failure "already holds checkpoints (the latest: step-000008)" "$HCP" "${TRAIN[@]}" \
  --checkpoint-dir "$T/ck"
run sh -c "cd '$T/ck' && md5sum -c --quiet '$T/ck.md5'"
# One bit of step 8's weights flipped: the resume takes the one before it (step 4, where the
# resumed run started: it wrote no checkpoint between) instead, and says so.
run python3 "$INPUTS/flip_bit.py" "$T/ck/step-000008/model.safetensors" model.embed_tokens.weight 1000
run "$HCP" train "$P/small-512-bf16.plan" --data "$BUNDLE/text.bin" --steps 9 --lr 1e-3 \
  --warmup 0 --checkpoint-dir "$T/ck" --resume
grep -q "which is damaged" "$LOG" && grep -q "resuming from step-000004 instead" "$LOG" ||
  { echo "== FAIL: no fallback to step-000004" | tee -a "$LOG"; status=1; }
run python3 "$INPUTS/poison.py" "$T/full/step-000008" "$T/nan" model.norm.weight --checksums fix
expect_failure "holds NaN" "$HCP" train "$P/small-512-bf16.plan" --data "$BUNDLE/text.bin" \
  --steps 2 --init "$T/nan"

run "$HCP" bench "$P/tiny-8192-bf16.plan" --steps 5 --warmup 2
exit $status

#!/usr/bin/env bash
# One GPU: the data path and the checkpoints that leave it, on the CUDA backend (the CPU ranks
# run the same in tests/lit: finetune-data.test, eval.test, train-blend.test,
# checkpoint-export.test, router-aux-loss.test).
#   1. the loss mask: the chats with their masked window-end targets changed train to the same
#      step-1 loss bit for bit (later steps within the GPU's run-to-run 1e-4: the attention
#      backward adds in a varying order), and without the mask they differ;
#   2. the held-out loss: a run with --eval-data trains as one without (within that 1e-4) and
#      records eval_loss;
#   3. a blend of the chats and the licence texts trains; checkpoints of the bf16 plan hold bf16
#      weights with their fp32 masters, the tokenizer and config.json, and a stopped and resumed
#      run repeats the uninterrupted one (1e-4);
#   4. transformers loads the GPU's bf16 checkpoint (and its tokenizer): from_pretrained's loss
#      equals run-step's on the f32 plan over the same weights (CPU ranks, fp32: 1e-5), and
#      AutoTokenizer gives the ids `hybridcp tokenize` gave;
#   5. the MoE load-balancing loss: the gpu-shapes plans with --router-aux-loss 0.5, bf16 on the
#      GPU against f32 on the CPU (test_plan_step's tolerances), its kernels' tests, and its cost
#      in a step of granite-4.0-h-tiny at s = 8192.
#
#   run(command="scripts/gpu/run_data_checks.sh", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=${1:-$ROOT/build-gpu/bundle}
LOG=${OUT:-/tmp}/data_checks.log
source "$ROOT/scripts/gpu/common.sh"
HCP=$BUNDLE/bin/hybridcp
P=$BUNDLE/plans
D=$BUNDLE/data
FIX=$ROOT/tests/fixtures/gpu-shapes
INPUTS=$ROOT/tests/lit/e2e/Inputs
T=/tmp/hcp-data-checks
rm -rf "$T" && mkdir -p "$T"
compare() { run python3 "$INPUTS/compare_metrics.py" "$@"; }
differ() {
  echo "== (must differ) compare_metrics.py $*" | tee -a "$LOG"
  if python3 "$INPUTS/compare_metrics.py" "$@" >>"$LOG" 2>&1; then
    echo "== FAIL: the same losses" | tee -a "$LOG"
    status=1
  fi
}
TRAIN=(train "$P/data-512-bf16.plan" --steps 4 --lr 1e-3 --warmup 0)

# 1. The loss mask.
run "$HCP" "${TRAIN[@]}" --data "$D/chat" --metrics "$T/masked.jsonl"
run "$HCP" "${TRAIN[@]}" --data "$D/chat-retargeted" --metrics "$T/retargeted.jsonl"
compare "$T/masked.jsonl" "$T/retargeted.jsonl" 1 1 0
compare "$T/masked.jsonl" "$T/retargeted.jsonl" 2 4 1e-4
run python3 "$ROOT/tests/lit/tools/Inputs/loss_mask.py" plain "$D/chat" "$T/plain"
run python3 "$ROOT/tests/lit/tools/Inputs/loss_mask.py" plain "$D/chat-retargeted" "$T/plain-retargeted"
run "$HCP" "${TRAIN[@]}" --steps 1 --data "$T/plain" --metrics "$T/plain.jsonl"
run "$HCP" "${TRAIN[@]}" --steps 1 --data "$T/plain-retargeted" --metrics "$T/plain-retargeted.jsonl"
differ "$T/plain.jsonl" "$T/plain-retargeted.jsonl" 1 1 0

# 2. The held-out loss.
run "$HCP" "${TRAIN[@]}" --data "$D/chat" --eval-data "$D/chat-eval" --eval-every 2 \
  --metrics "$T/eval.jsonl"
compare "$T/masked.jsonl" "$T/eval.jsonl" 1 4 1e-4
run python3 "$INPUTS/eval_metrics.py" steps "$T/eval.jsonl" 2,4 1024

# 3. A blend, bf16 checkpoints with masters and the tokenizer, a stopped and resumed run.
BLEND=(--data 0.7 "$D/chat" 0.3 "$D/licences" --tokenizer "$D/tokenizer.json")
run "$HCP" "${TRAIN[@]}" "${BLEND[@]}" --checkpoint-dir "$T/full" --metrics "$T/full.jsonl"
run "$HCP" "${TRAIN[@]}" "${BLEND[@]}" --checkpoint-dir "$T/ck" --stop-after 2 \
  --metrics "$T/resumed.jsonl"
run "$HCP" "${TRAIN[@]}" --data 0.7 "$D/chat" 0.3 "$D/licences" --checkpoint-dir "$T/ck" \
  --resume --metrics "$T/resumed.jsonl"
compare "$T/full.jsonl" "$T/resumed.jsonl" 3 4 1e-4
run python3 "$INPUTS/safetensors_dtypes.py" "$T/full/step-000004/model.safetensors" \
  "$T/full/step-000004/optimizer/model.safetensors"
run cmp "$T/full/step-000004/tokenizer.json" "$D/tokenizer.json"

# 4. transformers loads the GPU's checkpoint; run-step of the f32 plan on the same weights.
run python3 - "$T/inputs.safetensors" <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(5)
ids = torch.randint(0, 1500, (2, 512), generator=g)
targets = torch.full_like(ids, -100)
targets[:, :-1] = ids[:, 1:]
save_file({"input_ids": ids, "targets": targets}, sys.argv[1])
PY
run "$HCP" run-step "$P/data-512-f32.plan" --weights "$T/full/step-000004" \
  --inputs "$T/inputs.safetensors" --save "$T/ours.safetensors"
run python3 "$ROOT/scripts/gpu/check_from_pretrained.py" "$T/full/step-000004" \
  "$T/inputs.safetensors" "$T/ours.safetensors"
run python3 - "$T/full/step-000004" "$D/chat" <<'PY'
import struct, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
idx = open(sys.argv[2] + ".idx", "rb").read()
n = struct.unpack_from("<Q", idx, 18)[0]
length = struct.unpack_from("<i", idx, 34)[0]
ours = list(struct.unpack_from(f"<{length}H", open(sys.argv[2] + ".bin", "rb").read(), 0))
text = tok.decode(ours)
theirs = tok.encode(text, add_special_tokens=False)
print(f"AutoTokenizer.from_pretrained({sys.argv[1]}): {type(tok).__name__}; the first of {n} "
      f"documents, {length} ids: decoded and encoded again {'the same' if theirs == ours else 'OTHER'}")
sys.exit(0 if theirs == ours else 1)
PY

# 5. The load-balancing loss on the GPU.
run "$BUNDLE/bin/test_plan_step" "$P/gpu-shapes-aux-bf16.plan" "$P/gpu-shapes-aux-f32.plan" \
  --weights "$FIX" --inputs "$FIX/reference.safetensors"
run "$BUNDLE/bin/test_kernels_cuda" --filter router_load
# Its cost in a step of granite-4.0-h-tiny at s = 8192 (40 MoE layers), without and with it.
run "$HCP" bench "$P/tiny-8192-bf16.plan" --steps 5 --warmup 2
run "$HCP" bench "$P/tiny-8192-bf16-aux.plan" --steps 5 --warmup 2
exit $status

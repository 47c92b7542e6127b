#!/usr/bin/env bash
# A checkpoint `hybridcp train` writes loads in transformers: train the small demo model (f32, CPU
# ranks) for 3 steps on the bundle's text, then load step 3 with from_pretrained (its config.json
# is the one the plan carries) and compare transformers' loss on a fixed batch with `run-step`'s
# on the same checkpoint and batch (fp32 both: 1e-5 relative).
#   run(command="bash scripts/gpu/check_from_pretrained.sh", carry=["build-gpu/carry"])
# (Or train and run-step on this machine, carry the directory, and run check_from_pretrained.py
# there alone: the checkpoint is the same wherever the CPU backend writes it.)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/build-gpu/bundle
LOG=${OUT:-/tmp}/from_pretrained.log
source "$ROOT/scripts/gpu/common.sh"
HCP=$BUNDLE/bin/hybridcp
P=$BUNDLE/plans
work=$(mktemp -d)

run "$HCP" train "$P/demo-64-f32.plan" --data "$BUNDLE/text.bin" --steps 3 --lr 3e-3 \
  --checkpoint-dir "$work/ckpt"
ls "$work/ckpt/step-000003" | tee -a "$LOG"
# A batch the model did not train on: the plan's micro-batch of 2 x 64 tokens, targets shifted,
# the last of each row and a span in the middle ignored.
run python3 - "$work/inputs.safetensors" <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(5)
ids = torch.randint(0, 259, (2, 64), generator=g)
targets = torch.full_like(ids, -100)
targets[:, :-1] = ids[:, 1:]
targets[1, 10:20] = -100
save_file({"input_ids": ids, "targets": targets}, sys.argv[1])
PY
run "$HCP" run-step "$P/demo-64-f32.plan" --weights "$work/ckpt/step-000003" \
  --inputs "$work/inputs.safetensors" --save "$work/ours.safetensors"
run python3 "$ROOT/scripts/gpu/check_from_pretrained.py" "$work/ckpt/step-000003" \
  "$work/inputs.safetensors" "$work/ours.safetensors"
rm -rf "$work"
exit $status

#!/usr/bin/env python3
"""check_from_pretrained.py CHECKPOINT_DIR INPUTS.safetensors OURS.safetensors: loads a checkpoint
that `hybridcp train` wrote with transformers' from_pretrained (no other help: its config.json and
model.safetensors as written) and computes GraniteMoeHybridForCausalLM's loss on the inputs that
`hybridcp run-step --weights CHECKPOINT_DIR` ran (input_ids, and targets: labels shifted left, -100
ignored); prints both losses and fails if they differ by more than 1e-5 relative (both fp32)."""
import sys

import torch
import transformers
from safetensors.torch import load_file

checkpoint, inputs_path, ours_path = sys.argv[1:4]
model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
model.eval()
inputs = load_file(inputs_path)
ids, targets = inputs["input_ids"].long(), inputs["targets"].long()
with torch.no_grad():
    logits = model(input_ids=ids).logits.float()
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                         ignore_index=-100)
ours = float(load_file(ours_path)["loss"][0])
theirs = float(loss)
rel = abs(ours - theirs) / abs(theirs)
print(f"transformers {transformers.__version__} {type(model).__name__}.from_pretrained({checkpoint}): "
      f"loss {theirs:.7f}; hybridcp run-step {ours:.7f}; relative difference {rel:.2e}")
sys.exit(0 if rel <= 1e-5 else 1)

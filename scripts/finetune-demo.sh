#!/usr/bin/env bash
# The fine-tuning recipe on this machine (installs what is missing, builds into build/): a small
# Granite-shaped model with the vocabulary of a Hugging Face tokenizer.json
# (tests/fixtures/tokenizer/granite-style.json: byte-level BPE with Granite's role tokens) is
# fine-tuned from a Hugging Face checkpoint directory on chat data in JSONL, with the loss on
# the assistant turns only and a held-out loss. No downloads: the starting checkpoint is made
# here first (a short pre-training on the licence texts Debian ships; a checkpoint directory from
# the Hub is read the same way), and the chat data is generated (additions, "What is 17 + 25?"
# -> "42."). Output in finetune-run/: datasets, checkpoints, metrics, loss.svg.
#   scripts/finetune-demo.sh [STEPS]     (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
scripts/install-deps.sh
if [ ! -x build/bin/hybridcp ]; then
  cmake --preset default >/dev/null
  cmake --build --preset default -j"$(nproc)" --target hybridcp
fi
hcp=build/bin/hybridcp
tokenizer=tests/fixtures/tokenizer/granite-style.json
out=finetune-run
rm -rf "$out" && mkdir -p "$out"

echo "== the model: tests/configs/granite-small-demo.json with the tokenizer's 1,500 ids"
python3 - tests/configs/granite-small-demo.json "$out/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(vocab_size=1536, bos_token_id=0, eos_token_id=0, pad_token_id=0)  # <|end_of_text|>
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
$hcp compile "$out/config.json" --seq 128 --micro-batch 4 -o "$out/model.plan"

echo "== 1. a starting checkpoint (config.json + model.safetensors): pre-training on text"
$hcp tokenize --tokenizer "$tokenizer" /usr/share/common-licenses -o "$out/licences"
$hcp train "$out/model.plan" --data "$out/licences" --steps 60 --lr 3e-3 --warmup 5 \
  --tokenizer "$tokenizer" \
  --checkpoint-dir "$out/base" --log-every 20

echo "== 2. chat data: the loss counts the assistant turns only"
python3 - "$out" <<'PY'
import json, random, sys
random.seed(0)
def conversation():
    a, b = random.randrange(50), random.randrange(50)
    return {"messages": [{"role": "system", "content": "You add numbers."},
                         {"role": "user", "content": f"What is {a} + {b}?"},
                         {"role": "assistant", "content": f"{a + b}."}]}
for name, count in (("train", 3000), ("held-out", 200)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for _ in range(count):
            f.write(json.dumps(conversation()) + "\n")
PY
$hcp tokenize --tokenizer "$tokenizer" "$out/train.jsonl" -o "$out/train"
$hcp tokenize --tokenizer "$tokenizer" "$out/held-out.jsonl" -o "$out/held-out"

echo "== 3. fine-tuning from the checkpoint, the held-out loss every 10 steps"
# A tiny model barely pre-trained: a higher learning rate than --init's default (2e-5) suits it.
$hcp train "$out/model.plan" --init "$out/base/step-000060" --data "$out/train" \
  --eval-data "$out/held-out" --eval-every 10 --eval-tokens 2064 --steps "$steps" --lr 1e-3 \
  --warmup 5 --checkpoint-dir "$out/finetuned" --metrics "$out/metrics.jsonl" --log-every 10
$hcp plot "$out/metrics.jsonl" -o "$out/loss.svg" --title "fine-tuning on chat data"
python3 - "$out/metrics.jsonl" <<'PY'
import json, sys
evals = [(r["step"], r["eval_loss"]) for r in map(json.loads, open(sys.argv[1])) if "eval_loss" in r]
print("held-out loss: " + ", ".join(f"step {s} {l:.3f}" for s, l in evals))
assert evals[-1][1] < evals[0][1], "the held-out loss did not go down"
PY
echo "== done: $out/finetuned/$(cat "$out/finetuned/latest") is a Hugging Face checkpoint (config.json, model.safetensors); $out/loss.svg"

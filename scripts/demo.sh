#!/usr/bin/env bash
# The main job on this machine (installs what is missing, builds into build/): trains a small
# Granite-shaped hybrid model (Mamba2 + attention + MoE layers, tests/configs/
# granite-small-demo.json) with context parallelism over 2 CPU ranks (cp = 2, zigzag layout)
# on real text -- the licence texts Debian ships in /usr/share/common-licenses, as byte-level
# tokens -- and shows the loss going down. Output in demo-run/: metrics, checkpoints, loss.svg.
#   scripts/demo.sh [STEPS]     (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
scripts/install-deps.sh
if [ ! -x build/bin/hybridcp ]; then
  cmake --preset default >/dev/null
  cmake --build --preset default -j"$(nproc)" --target hybridcp
fi
hcp=build/bin/hybridcp
out=demo-run
rm -rf "$out" && mkdir -p "$out"
mpirun=(mpirun --oversubscribe --mca btl self,vader)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)

echo "== the model"
$hcp inspect tests/configs/granite-small-demo.json --seq 128 | sed -n '2,6p'
echo "== text -> tokens"
$hcp tokenize /usr/share/common-licenses -o "$out/corpus.bin"
echo "== compile: 2 context-parallel ranks, zigzag layout, 4 sequences of 128 tokens per step"
$hcp compile tests/configs/granite-small-demo.json --seq 128 --micro-batch 4 --cp 2 \
  --layout zigzag -o "$out/demo.plan"
$hcp inspect "$out/demo.plan" | grep -A4 "^ranks:"
echo "== train ($steps steps on 2 ranks)"
"${mpirun[@]}" -np 2 $hcp train "$out/demo.plan" --data "$out/corpus.bin" --steps "$steps" \
  --lr 3e-3 --warmup 5 --log-every 5 --checkpoint-dir "$out/checkpoints" \
  --checkpoint-every 20 --metrics "$out/metrics.jsonl"
$hcp plot "$out/metrics.jsonl" -o "$out/loss.svg" --title "granite-small-demo, cp=2 zigzag"
python3 - "$out/metrics.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
first, last = r[0]["loss"], sum(x["loss"] for x in r[-5:]) / 5
print(f"loss: {first:.3f} at step 1 -> {last:.3f} (mean of the last 5 steps)")
PY

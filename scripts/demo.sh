#!/usr/bin/env bash
# The main job on this machine (installs what is missing, builds into build/):
#   1. compiles a small Granite-shaped hybrid model (Mamba2 + attention + MoE) into a plan,
#   2. runs one training step on the CPU backend and checks loss and every gradient against
#      transformers' GraniteMoeHybridForCausalLM (the committed fixture),
#   3. compiles granite-4.0-h-tiny at 8192 tokens and shows what its plan costs.
# Context-parallel training with a loss curve replaces step 2 once the training loop lands
# (see docs/status.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [ ! -x build/bin/hybridcp ]; then
  cmake --preset default >/dev/null
  cmake --build --preset default -j"$(nproc)" --target hybridcp
fi
hcp=build/bin/hybridcp
fixture=tests/fixtures/hybrid-moe
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== compile the small hybrid model (4 layers: Mamba2, attention, MoE)"
$hcp compile $fixture/config.json --seq 48 --micro-batch 2 -o "$work/small.plan"
echo "== one training step on the CPU, checked against transformers"
$hcp run-step "$work/small.plan" --weights $fixture --inputs $fixture/reference.safetensors --compare $fixture
echo "== granite-4.0-h-tiny at s = 8192"
$hcp inspect --model granite-4.0-h-tiny --seq 8192
$hcp compile --model granite-4.0-h-tiny --seq 8192 -o "$work/tiny.plan"
$hcp inspect "$work/tiny.plan" | head -12

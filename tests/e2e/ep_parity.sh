#!/usr/bin/env bash
# Data and expert parallelism do not change the numbers. On a small Granite-shaped MoE (8
# experts, top 2: tests/configs/moe-8.json) with random weights (--seed), one training step of a
# global batch of 4 sequences of 32 tokens on CPU ranks under mpirun, for each mesh below, is
# compared with the single-rank run of the same global batch: loss within 1e-6 relative, every
# gradient within 1e-5 relative RMS (fp32). With dp > 1 each dp group runs its own micro-batch
# (4 / dp sequences of the file; run-step slices them) and the loss is normalised by the valid
# targets of the whole batch, so losses and gradients add up over dp exactly as over one rank.
# usage: ep_parity.sh BUILD_DIR [MPIEXEC]     prints one line per mesh, fails on any miss
set -euo pipefail
build=$1
mpiexec=${2:-mpirun}
hcp=$build/bin/hybridcp
config=$(cd "$(dirname "$0")/../configs" && pwd)/moe-8.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launch=("$mpiexec" --oversubscribe --allow-run-as-root --mca btl self,vader)
seed=7
batch=4
seq=32

# The global batch: random token ids, targets shifted on the full sequence (the last position
# and a few others ignored), as int64 safetensors.
python3 - "$work/batch.safetensors" "$batch" "$seq" <<'EOF'
import json, random, struct, sys
path, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(2024)
ids = [[rng.randrange(128) for _ in range(seq)] for _ in range(batch)]
targets = [row[1:] + [-100] for row in ids]
for b in range(batch):
    targets[b][rng.randrange(seq - 1)] = -100
def flat(rows):
    return struct.pack("<%dq" % (batch * seq), *[v for row in rows for v in row])
data = [("input_ids", flat(ids)), ("targets", flat(targets))]
header, offset = {}, 0
for name, raw in data:
    header[name] = {"dtype": "I64", "shape": [batch, seq], "data_offsets": [offset, offset + len(raw)]}
    offset += len(raw)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(raw for _, raw in data))
EOF

# ACTUAL REFERENCE COUNT -> "loss_error worst_gradient_error", or fails; COUNT gradients must
# have been compared (compare-step also fails when the two sets of names differ).
compare() {
  local out compared
  if ! out=$("$hcp" compare-step "$1" "$2" --loss-tolerance 1e-6 --grad-tolerance 1e-5 2>&1); then
    echo "$out" >&2
    return 1
  fi
  compared=$(echo "$out" | sed -n 's/^gradients: \([0-9]*\) compared.*/\1/p')
  if [ "$compared" != "$3" ]; then
    echo "$1: $compared gradients compared, the model has $3" >&2
    return 1
  fi
  echo "$out" | sed -n 's/.*loss.*relative error \([^ ]*\).*/\1/p;s/.*worst relative RMS \([^ ]*\).*/\1/p' | paste -sd' '
}

"$hcp" compile "$config" --seq "$seq" --micro-batch "$batch" -o "$work/single.plan" 2>/dev/null
# Every parameter has a gradient: each comparison must cover them all.
params=$("$hcp" inspect "$work/single.plan" | sed -n 's/^parameters: \([0-9]*\) tensors.*/\1/p')
"$hcp" run-step "$work/single.plan" --seed "$seed" --inputs "$work/batch.safetensors" \
  --save "$work/single.safetensors" >/dev/null

failures=0
printf '%-14s %-5s | %-25s\n' mesh ranks "vs 1 rank (loss grad)"
# cp dp ep [layout]
for mesh in "2 1 2" "4 1 4" "8 1 8" "1 2 1" "1 4 4" "4 2 1" "2 2 4" "2 2 2 zigzag" "1 2 2"; do
  read -r cp dp ep layout <<<"$mesh"
  layout=${layout:-contiguous}
  name=cp$cp-dp$dp-ep$ep$([ "$layout" = zigzag ] && echo -zz || true)
  ranks=$((cp * dp))
  plan=$work/$name.plan
  result=$work/$name.safetensors
  "$hcp" compile "$config" --seq "$seq" --micro-batch $((batch / dp)) --cp "$cp" --dp "$dp" \
    --ep "$ep" --layout "$layout" -o "$plan" 2>/dev/null
  if ! "${launch[@]}" -np "$ranks" "$hcp" run-step "$plan" --seed "$seed" \
    --inputs "$work/batch.safetensors" --save "$result" >/dev/null; then
    echo "$name: the run failed" >&2
    failures=$((failures + 1))
    continue
  fi
  if ! errors=$(compare "$result" "$work/single.safetensors" "$params"); then
    echo "$name: MISMATCH" >&2
    failures=$((failures + 1))
    continue
  fi
  printf '%-14s %-5s | %-25s\n' "$name" "$ranks" "$errors"
done
if [ "$failures" -gt 0 ]; then
  echo "$failures meshes failed" >&2
  exit 1
fi
echo "all meshes match"

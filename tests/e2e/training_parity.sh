#!/usr/bin/env bash
# The reference experiments' parity table on CPU ranks: the same model (tests/configs/
# granite-moe8-bytes.json: Granite-shaped, Mamba2 + attention, 8 routed experts top-2), the same
# initialisation and data (byte-level tokens of /usr/share/common-licenses), global batch 4 of 64
# tokens, fp32, 20 steps, trained with every split the reference ran:
#   single rank | cp8 | cp8 + ep8 | cp8 with gradient accumulation 2 | cp4-dp2 | cp1-dp4-ep4
# Every step's loss must agree with the single-rank run to 1e-5 relative. Prints a markdown table
# (docs/training-parity.md holds one) and fails on any miss.
# usage: training_parity.sh BUILD_DIR [MPIEXEC]
set -euo pipefail
build=$1
mpiexec=${2:-mpirun}
hcp=$build/bin/hybridcp
root=$(cd "$(dirname "$0")/../.." && pwd)
config=$root/tests/configs/granite-moe8-bytes.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launch=("$mpiexec" --oversubscribe --allow-run-as-root --mca btl self,vader)
steps=20
seq=64

"$hcp" tokenize /usr/share/common-licenses -o "$work/corpus.bin" >/dev/null

# name | ranks | compile options | train options
runs=(
  "single|1|--micro-batch 4|"
  "cp8|8|--micro-batch 4 --cp 8|"
  "cp8-ep8|8|--micro-batch 4 --cp 8 --ep 8|"
  "cp8-gas2|8|--micro-batch 2 --cp 8|--grad-accum 2"
  "cp4-dp2|8|--micro-batch 2 --cp 4 --dp 2|"
  "cp1-dp4-ep4|4|--micro-batch 1 --dp 4 --ep 4|"
)
for run in "${runs[@]}"; do
  IFS='|' read -r name ranks compile train <<<"$run"
  # shellcheck disable=SC2086
  "$hcp" compile "$config" --seq "$seq" $compile -o "$work/$name.plan" 2>/dev/null
  # shellcheck disable=SC2086
  "${launch[@]}" -np "$ranks" "$hcp" train "$work/$name.plan" --data "$work/corpus.bin" \
    --steps "$steps" --lr 3e-3 --warmup 2 --seed 11 --log-every 100 $train \
    --metrics "$work/$name.jsonl" >/dev/null
done

python3 - "$work" "$steps" <<'PY'
import json, sys
work, steps = sys.argv[1], int(sys.argv[2])
names = ["single", "cp8", "cp8-ep8", "cp8-gas2", "cp4-dp2", "cp1-dp4-ep4"]
loss = {n: {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{work}/{n}.jsonl")} for n in names}
print("| step | " + " | ".join(names) + " |")
print("|---" * (len(names) + 1) + "|")
worst = {n: 0.0 for n in names}
for s in range(1, steps + 1):
    ref = loss["single"][s]
    cells = []
    for n in names:
        err = abs(loss[n][s] - ref) / abs(ref)
        worst[n] = max(worst[n], err)
        cells.append(f"{loss[n][s]:.6f}")
    print(f"| {s} | " + " | ".join(cells) + " |")
print("| worst rel. error | " + " | ".join(f"{worst[n]:.1e}" for n in names) + " |")
bad = [n for n in names if worst[n] > 1e-5]
if loss["single"][steps] >= loss["single"][1]:
    bad.append("(the loss did not go down)")
if bad:
    print("MISMATCH: " + ", ".join(bad), file=sys.stderr)
    sys.exit(1)
print(f"\nall splits agree with the single-rank run to 1e-5 at every step")
PY

#!/usr/bin/env bash
# Context parallelism does not change the numbers. For each fixture model, one training step on
# CPU ranks under mpirun, for cp in {1, 2, 4, 8} x layout {contiguous, zigzag} x state scan
# {allgather, chain} (and, at cp 2 and 8, "rescan": --incoming-state rescan, the state-only
# summary and a second scan instead of the default correction), is compared with
#   - the single-rank run: loss within 1e-6 relative, every gradient within 1e-5 relative RMS;
#   - transformers (the fixture): loss 1e-5, gradients 1e-4 (fp32 on both sides).
# usage: cp_parity.sh BUILD_DIR [MPIEXEC]     prints one line per configuration, fails on any miss
set -euo pipefail
build=$1
mpiexec=${2:-mpirun}
hcp=$build/bin/hybridcp
fixtures=$(cd "$(dirname "$0")/../fixtures" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launch=("$mpiexec" --oversubscribe --allow-run-as-root --mca btl self,vader)

# ACTUAL REFERENCE LOSS_TOL GRAD_TOL COUNT -> "loss_error worst_gradient_error", or fails; COUNT
# gradients must have been compared (compare-step also fails when the two sets of names differ).
compare() {
  local out compared
  if ! out=$("$hcp" compare-step "$1" "$2" --loss-tolerance "$3" --grad-tolerance "$4" 2>&1); then
    echo "$out" >&2
    return 1
  fi
  compared=$(echo "$out" | sed -n 's/^gradients: \([0-9]*\) compared.*/\1/p')
  if [ "$compared" != "$5" ]; then
    echo "$1: $compared gradients compared, the model has $5" >&2
    return 1
  fi
  echo "$out" | sed -n 's/.*loss.*relative error \([^ ]*\).*/\1/p;s/.*worst relative RMS \([^ ]*\).*/\1/p' | paste -sd' '
}

failures=0
printf '%-10s %-3s %-10s %-9s | %-21s | %-21s\n' model cp layout scan "vs 1 rank (loss grad)" "vs transformers"
for model in hybrid-moe dense; do
  config=$fixtures/$model/config.json
  batch=$(python3 -c "import json; print(json.load(open('$fixtures/$model/meta.json'))['batch'])")
  seq=$(python3 -c "import json; print(json.load(open('$fixtures/$model/meta.json'))['seq'])")
  # Every parameter has a gradient in the fixture: each comparison must cover them all.
  params=$(python3 -c "import json, struct; f = open('$fixtures/$model/reference.safetensors', 'rb'); h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0])); print(sum(k.startswith('grad.') for k in h))")
  "$hcp" compile "$config" --seq "$seq" --micro-batch "$batch" -o "$work/single.plan" 2>/dev/null
  "$hcp" run-step "$work/single.plan" --weights "$fixtures/$model" \
    --inputs "$fixtures/$model/reference.safetensors" --save "$work/single.safetensors" >/dev/null
  for cp in 1 2 4 8; do
    for layout in contiguous zigzag; do
      for scan in allgather chain rescan; do
        [ "$cp" = 1 ] && [ "$layout" = contiguous ] && [ "$scan" = chain ] && continue
        [ "$scan" = rescan ] && [ "$cp" != 2 ] && [ "$cp" != 8 ] && continue
        how=(--state-scan "$scan")
        [ "$scan" = rescan ] && how=(--incoming-state rescan)
        plan=$work/$model-$cp-$layout-$scan.plan
        result=$work/$model-$cp-$layout-$scan.safetensors
        "$hcp" compile "$config" --seq "$seq" --micro-batch "$batch" --cp "$cp" --layout "$layout" \
          "${how[@]}" -o "$plan" 2>/dev/null
        if ! "${launch[@]}" -np "$cp" "$hcp" run-step "$plan" --weights "$fixtures/$model" \
          --inputs "$fixtures/$model/reference.safetensors" --save "$result" >/dev/null; then
          echo "$model cp=$cp $layout $scan: the run failed" >&2
          failures=$((failures + 1))
          continue
        fi
        if ! vs_single=$(compare "$result" "$work/single.safetensors" 1e-6 1e-5 "$params") ||
          ! vs_hf=$(compare "$result" "$fixtures/$model" 1e-5 1e-4 "$params"); then
          echo "$model cp=$cp $layout $scan: MISMATCH" >&2
          failures=$((failures + 1))
          continue
        fi
        printf '%-10s %-3s %-10s %-9s | %-21s | %-21s\n' "$model" "$cp" "$layout" "$scan" "$vs_single" "$vs_hf"
      done
    done
  done
done
if [ "$failures" -gt 0 ]; then
  echo "$failures configurations failed" >&2
  exit 1
fi
echo "all configurations match"

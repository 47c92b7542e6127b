#!/usr/bin/env bash
# The command line's runtime paths under AddressSanitizer + UndefinedBehaviorSanitizer (the
# sanitize build has no compiler, so the plans come from a hybridcp that has one): run-step
# against a transformers fixture on one rank and under mpirun with cp=2; train with checkpoints,
# stopped and resumed, on one rank and on two; and refusals of bad input on the way (a damaged
# plan, a missing checkpoint). Any sanitizer report aborts the process and fails the script.
# usage: sanitized_cli.sh SANITIZED_BUILD_DIR COMPILING_HYBRIDCP [MPIEXEC]
set -euo pipefail
hcp=$1/bin/hybridcp
compiler=$2
mpiexec=${3:-mpirun}
root=$(cd "$(dirname "$0")/../.." && pwd)
fixtures=$root/tests/fixtures
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launch=("$mpiexec" --oversubscribe --allow-run-as-root --mca btl self,vader)

step() { echo "== $*"; }
# PATTERN COMMAND...: runs COMMAND, which must succeed and print PATTERN (read whole: a grep that
# stops early would end the command with SIGPIPE).
expect_output() {
  local pattern=$1 out
  shift
  out=$("$@")
  grep -q "$pattern" <<<"$out" || { echo "no '$pattern' in the output of: $*" >&2; exit 1; }
}

step "run-step: the dense fixture, 1 rank and cp=2"
"$compiler" compile "$fixtures/dense/config.json" --seq 64 -o "$work/dense.plan"
"$compiler" compile "$fixtures/dense/config.json" --seq 64 --cp 2 --layout zigzag -o "$work/dense-cp2.plan"
expect_output MATCH "$hcp" run-step "$work/dense.plan" --weights "$fixtures/dense" \
  --inputs "$fixtures/dense/reference.safetensors" --compare "$fixtures/dense" --save "$work/one.safetensors"
expect_output MATCH "${launch[@]}" -np 2 "$hcp" run-step "$work/dense-cp2.plan" --weights "$fixtures/dense" \
  --inputs "$fixtures/dense/reference.safetensors" --compare "$work/one.safetensors" --traffic
expect_output "gradients: 34 compared" "$hcp" compare-step "$work/one.safetensors" "$fixtures/dense"

step "train: checkpoints, stop and resume, 1 rank and 2"
demo=$root/tests/configs/granite-small-demo.json
"$hcp" tokenize /usr/share/common-licenses -o "$work/corpus.bin" >/dev/null
"$compiler" compile "$demo" --seq 64 --micro-batch 2 -o "$work/one.plan"
"$compiler" compile "$demo" --seq 64 --micro-batch 2 --cp 2 --ep 2 --layout zigzag -o "$work/cp2.plan"
train=(--data "$work/corpus.bin" --steps 4 --warmup 1 --log-every 10)
"$hcp" train "$work/one.plan" "${train[@]}" --checkpoint-dir "$work/ck1" --checkpoint-every 2 \
  --stop-after 2 --metrics "$work/one.jsonl" >/dev/null
expect_output "resumed from" "$hcp" train "$work/one.plan" "${train[@]}" --checkpoint-dir "$work/ck1" \
  --resume --metrics "$work/one.jsonl"
"${launch[@]}" -np 2 "$hcp" train "$work/cp2.plan" "${train[@]}" --shard-optimizer \
  --checkpoint-dir "$work/ck2" --checkpoint-every 2 --stop-after 2 >/dev/null
expect_output "resumed from" "${launch[@]}" -np 2 "$hcp" train "$work/cp2.plan" "${train[@]}" \
  --shard-optimizer --checkpoint-dir "$work/ck2" --resume
"$hcp" plot "$work/one.jsonl" -o "$work/loss.svg" >/dev/null

step "refusals: a damaged plan, a missing checkpoint"
cp "$work/one.plan" "$work/bad.plan"
printf '\x55' | dd of="$work/bad.plan" bs=1 seek=200 conv=notrunc 2>/dev/null
if "$hcp" train "$work/bad.plan" "${train[@]}" >"$work/bad.out" 2>&1; then
  echo "a damaged plan was accepted" >&2
  exit 1
fi
if "$hcp" train "$work/one.plan" "${train[@]}" --checkpoint-dir "$work/none" --resume \
  >"$work/none.out" 2>&1; then
  echo "a resume without a checkpoint was accepted" >&2
  exit 1
fi
grep -q "checksum mismatch: the plan is damaged" "$work/bad.out"
grep -q "error:" "$work/none.out"
echo "the command line's paths ran clean under the sanitizers"

#!/usr/bin/env bash
# The bf16 errors that test_plan_step's tolerances are derived from: the small plans (1 x 300 and
# 2 x 512) against the CPU f32 plan for SEEDS random initialisations and token draws, and the
# gpu-shapes fixture against transformers. Prints, per gradient family (test_plan_step's), the
# worst relative RMS over every run, the worst loss error, and the routing flips.
#
#   scripts/gpu/run_tolerance_survey.sh [SEEDS]      (default 6; output also in $OUT/survey/)
#   run(command="scripts/gpu/run_tolerance_survey.sh", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/build-gpu/bundle
LOG=${OUT:-/tmp}/survey.log
source "$ROOT/scripts/gpu/common.sh"
seeds=${1:-6}
dir=${OUT:-/tmp}/survey
mkdir -p "$dir"
P=$BUNDLE/plans
for seed in $(seq 1 "$seeds"); do
  for name in small-300 small-512; do
    "$BUNDLE/bin/test_plan_step" "$P/$name-bf16.plan" "$P/$name-f32.plan" --seed "$seed" \
      >"$dir/$name-seed$seed.log" 2>&1
  done
done
FIX=$ROOT/tests/fixtures/gpu-shapes
"$BUNDLE/bin/test_plan_step" "$P/gpu-shapes-bf16.plan" "$P/gpu-shapes-f32.plan" --weights "$FIX" \
  --inputs "$FIX/reference.safetensors" --reference "$FIX/reference.safetensors" \
  >"$dir/gpu-shapes.log" 2>&1
python3 - "$dir" <<'PY'
import glob, re, sys
families = [("embedding", "embed_tokens"), ("norms", "layernorm|model.norm.|mamba.norm."),
            ("attention", "self_attn."), ("mamba projections", "mamba.in_proj|mamba.out_proj"),
            ("mamba conv", "mamba.conv1d"), ("mamba A, D, dt", "mamba.A_log|mamba.D|mamba.dt_bias"),
            ("router", "router."), ("experts", "block_sparse_moe.input_linear|block_sparse_moe.output_linear"),
            ("shared MLP", "shared_mlp.")]
worst, loss, flips, verdicts = {}, [], [], []
for path in sorted(glob.glob(sys.argv[1] + "/*.log")):
    text = open(path).read()
    verdicts.append((path.split("/")[-1], re.findall(r"test_plan_step: (\w+)", text)))
    for name, error in re.findall(r"grad (\S+)\s+\d+\s+rel rms (\S+)", text):
        family = next(f for f, pattern in families if any(p in name for p in pattern.split("|")))
        if float(error) > worst.get(family, (0, ""))[0]:
            worst[family] = (float(error), name + " in " + path.split("/")[-1])
    loss += [float(x) for x in re.findall(r"loss: gpu \S+, cpu \S+, relative difference (\S+)", text)]
    flips += [float(x) for x in re.findall(r"MoE routing: (\S+)% of the tokens", text)]
for family, _ in families:
    print("%-18s worst %.2e  (%s)" % (family, *worst.get(family, (0, "-"))))
print("loss vs cpu: worst %.2e over %d runs" % (max(loss), len(loss)))
print("routing flips: %.2f%% to %.2f%%" % (min(flips), max(flips)))
for name, verdict in verdicts:
    print(name, verdict)
PY

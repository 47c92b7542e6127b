#!/usr/bin/env bash
# One GPU: every kernel of one step of a plan, timed one at a time by Nsight Compute (clocks and
# caches left alone), summed by kernel name and by name and grid, into $OUT/kernels.txt (the raw
# CSV beside it). Where the bench's --profile gives a plan step's time, this splits it into the
# kernels it launches (cuBLASLt's among them).
#   run(command="scripts/gpu/profile_kernels.sh plans/tiny-8192-bf16.plan", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/build-gpu/bundle
LOG=${OUT:-/tmp}/profile_kernels.log
source "$ROOT/scripts/gpu/common.sh"
PLAN=$BUNDLE/${1:?usage: profile_kernels.sh PLAN (relative to the bundle)}
CSV=${OUT:-/tmp}/kernels.csv

NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
run "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --print-units base --log-file "$CSV" "$BUNDLE/bin/hybridcp" bench "$PLAN" --steps 1 --warmup 0
python3 "$ROOT/scripts/gpu/summarize_kernels.py" "$CSV" | tee "${OUT:-/tmp}/kernels.txt"
exit $status

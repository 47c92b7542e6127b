#!/usr/bin/env bash
# Runs the CUDA sequence-kernel test (Mamba2 SSD scan and its initial-state correction, causal
# GQA attention: correctness against the CPU oracle, then timing against
# shared/reference/anchors.md) on a GPU machine. The binary comes from scripts/gpu/make_bundle.sh's
# bundle (the one CUDA build: here, in the main project), carried as build-gpu/carry; a register,
# spill and wgmma report is read from it with cuobjdump first.
#
#   run(command="scripts/gpu/run_sequence_tests.sh [test args...]", carry=["build-gpu/carry"])
#     e.g. --seed 42, --no-timing, --only ssd
#
# Environment: BUNDLE (default build-gpu/bundle); ATTN_IMPLS (default "hopper hopper-det fa2"):
# the attention implementations to compare, one test process each (--impl NAME; a fault in one
# cannot take the others down), each under `timeout ${IMPL_TIMEOUT:-240}`; ATTN_IMPLS="" runs the
# test once with the library default. Logs and the report go to $OUT when set (the device
# runner's output folder), else to /tmp. Exit status: the test's (0 iff all checks passed).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=${BUNDLE:-$ROOT/build-gpu/bundle}
LOGS=${OUT:-/tmp}
LOG=$LOGS/sequence_tests.log
source "$ROOT/scripts/gpu/common.sh"
BIN=$BUNDLE/bin/test_sequence_kernels
export PATH="/usr/local/cuda/bin:$PATH"

# Registers, spills and shared memory per kernel, and the wgmma (HGMMA) count of each Hopper
# attention kernel, from the binary's SASS.
# A mangled kernel name cut down to the kernel and its template arguments.
SHORT_NAMES='s/_ZN[^ ]*[0-9]((ssd|attn)_[a-z0-9_]+kernel[^ ]*)/\1/'
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-resource-usage "$BIN" 2>/dev/null |
    awk '/Function /{f=$2} /REG:/{print f, $0}' | grep -E "ssd_|attn_" |
    sed -E "$SHORT_NAMES" >"$LOGS/resource_usage.txt" || true
  grep -vE "LOCAL:0( |$)" "$LOGS/resource_usage.txt" | sed 's/^/  local memory (spills): /' | head -20
  cuobjdump --dump-sass "$BIN" 2>/dev/null |
    awk '/Function : /{f=$3} /HGMMA/{n[f]++} END{for (k in n) printf "  %6d HGMMA  %s\n", n[k], k}' |
    sed -E "$SHORT_NAMES" | tee "$LOGS/sass_summary.txt" || true
fi

echo "== run"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>/dev/null || true
IMPLS=${ATTN_IMPLS-hopper hopper-det fa2}
set +e
if [ -z "$IMPLS" ]; then
  "$BIN" "$@" 2>&1 | tee "$LOGS/test_sequence_kernels.log"
  rc=${PIPESTATUS[0]}
  exit "$rc"
fi
rc=0
summary=()
for impl in $IMPLS; do
  echo "== run --impl $impl"
  timeout "${IMPL_TIMEOUT:-240}" "$BIN" --impl "$impl" "$@" 2>&1 \
    | tee "$LOGS/test_sequence_kernels.$impl.log"
  r=${PIPESTATUS[0]}
  [ "$r" = 124 ] && echo "!! --impl $impl timed out (hang?)"
  [ "$r" != 0 ] && rc=1
  summary+=("$impl: exit $r; $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$LOGS/test_sequence_kernels.$impl.log" | tail -1)")
done
echo
echo "== summary (all implementations)"
for impl in $IMPLS; do
  grep -E '^(attn|SSD)[^:]* +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x$' "$LOGS/test_sequence_kernels.$impl.log" || true
done
for impl in $IMPLS; do
  grep -E 'FAIL|failed:|error' "$LOGS/test_sequence_kernels.$impl.log" | head -5 | sed "s/^/  [$impl] /" || true
done
printf '%s\n' "${summary[@]}"
echo "targets: attention fwd+bwd s=65536 <= 99 ms"
[ "$rc" = 0 ] && echo "all implementations passed" || echo "some implementation FAILED"
exit "$rc"

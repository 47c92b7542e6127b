#!/usr/bin/env bash
# Runs test_kernels_cuda on a GPU machine: every token-local CUDA kernel (runtime/kernels/cuda:
# GEMM, elementwise, norms, embedding, conv, MoE, cross-entropy, AdamW) against the CPU oracle
# (runtime/kernels/cpu) on fresh random data, then the real shapes timed. The binary comes from
# scripts/gpu/make_bundle.sh's bundle (the one CUDA build: here, in the main project), carried as
# build-gpu/carry; it needs only the CUDA libraries the GPU machines have.
#
#   run(command="scripts/gpu/run_kernel_tests.sh [test args...]", carry=["build-gpu/carry"])
#     --small           only the small odd shapes (seconds)
#     --no-timing       no timing runs
#     --filter NAME     only kernels whose name contains NAME (e.g. gemm, moe_experts, rms_norm)
#     --seed N          repeat a run's random data (each run prints its seed)
#
# Environment: BUNDLE (default build-gpu/bundle), TEST_BIN (another test_kernels_cuda).
# Output: the whole report goes to $OUT/kernel_tests.log when $OUT is set (the device runner's
# output folder), else to /tmp; stdout ends with a summary: the header, every FAIL line, every
# timed line, the totals. Exit status: the test's (0 iff every line passed).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=${BUNDLE:-$ROOT/build-gpu/bundle}
LOGS=${OUT:-/tmp}
LOG=$LOGS/kernel_tests.log
source "$ROOT/scripts/gpu/common.sh"
BIN=${TEST_BIN:-$BUNDLE/bin/test_kernels_cuda}

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
echo "== test_kernels_cuda $*"
"$BIN" "$@" >"$LOG" 2>&1
status=$?
# The summary: header lines, failures, timed lines, totals (the full report is in $LOG).
grep -E "^test_kernels_cuda|^errors are" "$LOG" | head -n 2
echo "-- failures"
grep -E "^FAIL" "$LOG" || echo "(none)"
echo "-- timed (large shapes)"
grep -E "^(PASS|FAIL) .* ms " "$LOG" | cut -c 7- || true
grep -E "^test_kernels_cuda: .* lines" "$LOG" || tail -n 20 "$LOG"
echo "full report: $LOG (exit status $status)"
exit "$status"

#!/usr/bin/env bash
# Builds and runs test_kernels_cuda on a GPU machine: every token-local CUDA kernel
# (runtime/kernels/cuda: GEMM, elementwise, norms, embedding, conv, MoE, cross-entropy, AdamW)
# against the CPU oracle (runtime/kernels/cpu) on fresh random data, then the real shapes timed.
#
# Route: the GPU machines have CUDA 13.0, CMake 4.4 and ninja but no Abseil (nor nlohmann_json or
# FlatBuffers), so the main project cannot be configured there. tests/cuda/standalone is a small
# CMake project that builds only what the test needs: hcp_kernels_cuda (CUDA toolkit only), the
# CPU oracle compiled from runtime/kernels/cpu's own sources against a two-header Abseil shim
# (tests/cuda/shim: absl::Status and absl::StrFormat, the two things those files use), and the
# test. So NOTHING has to be carried: the working tree is enough (the build takes about a minute
# on 16 cores). On the development machine the same test builds inside the main project
# (target test_kernels_cuda, with the real Abseil) but cannot run there.
#
#   scripts/gpu/run_kernel_tests.sh [test args...]
#     --small           only the small odd shapes (seconds)
#     --no-timing       no timing runs
#     --filter NAME     only kernels whose name contains NAME (e.g. gemm, moe_experts, rms_norm)
#     --seed N          repeat a run's random data (each run prints its seed)
#
# Environment: BUILD_DIR (default build-kernel-tests), JOBS (default nproc), TEST_BIN: run this
# prebuilt binary instead of building (e.g. build-kernel-tests/bin/test_kernels_cuda built on the
# development machine with the same standalone project and carried: it needs only libcudart and
# libcublasLt from /usr/local/cuda, which the GPU machines have; saves the build's device time).
# Output: the whole report goes to $OUT/kernel_tests.log when $OUT is set (the device runner's
# output folder), else to the build directory; stdout ends with a summary: the header, every
# FAIL line, every timed line, the totals. Exit status: the test's (0 iff every line passed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-kernel-tests}
LOGS=${OUT:-$BUILD}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$BUILD" "$LOGS"
export PATH="/usr/local/cuda/bin:$PATH"

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true

# Configures (once) and builds the standalone project into $BUILD.
build() {
  echo "== build ($(nvcc --version | tail -1))"
  # A build directory configured elsewhere (another checkout path) cannot be reused.
  if [ -f "$BUILD/CMakeCache.txt" ] &&
    ! grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT/tests/cuda/standalone\$" "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  fi
  if ! cmake -S "$ROOT/tests/cuda/standalone" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    >"$LOGS/kernel_tests_configure.log" 2>&1; then
    tail -n 30 "$LOGS/kernel_tests_configure.log"
    echo "configure failed"
    exit 2
  fi
  if ! cmake --build "$BUILD" -j"$JOBS" --target test_kernels_cuda \
    >"$LOGS/kernel_tests_build.log" 2>&1; then
    grep -E "error|Error" "$LOGS/kernel_tests_build.log" | head -n 40 ||
      tail -n 40 "$LOGS/kernel_tests_build.log"
    echo "build failed"
    exit 2
  fi
  grep -E "warning" "$LOGS/kernel_tests_build.log" | head -n 20 || true
}

if [ -n "${TEST_BIN:-}" ]; then
  BIN=$TEST_BIN
  echo "== prebuilt $BIN"
else
  build
  BIN=$BUILD/bin/test_kernels_cuda
fi

echo "== test_kernels_cuda $*"
LOG="$LOGS/kernel_tests.log"
set +e
"$BIN" "$@" >"$LOG" 2>&1
status=$?
set -e
# The summary: header lines, failures, timed lines, totals (the full report is in $LOG).
grep -E "^test_kernels_cuda|^errors are" "$LOG" | head -n 2
echo "-- failures"
grep -E "^FAIL" "$LOG" || echo "(none)"
echo "-- timed (large shapes)"
grep -E "^(PASS|FAIL) .* ms " "$LOG" | cut -c 7- || true
grep -E "^test_kernels_cuda: .* lines" "$LOG" || tail -n 20 "$LOG"
echo "full report: $LOG (exit status $status)"
exit "$status"

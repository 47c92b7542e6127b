#!/usr/bin/env bash
# Builds and runs the CUDA sequence-kernel test (Mamba2 SSD scan, causal GQA attention: correctness
# against the CPU oracle, then timing against shared/reference/anchors.md) on a GPU machine, with
# plain nvcc and the host compiler: no CMake, no Abseil (the oracle's Kernels.h gets the shim in
# tests/cuda/shim). Everything it needs is in the repository: nothing else has to travel.
#
#   scripts/gpu/run_sequence_tests.sh [test args...]      e.g. --seed 42, --no-timing, --only ssd
#
# Environment: BUILD_DIR (default build-seq), JOBS (parallel compiles, default nproc), NVCC.
# Logs, the ptxas resource report and a SASS summary go to $OUT when set (the device runner's
# output folder), else to the build directory. Exit status: the test's (0 iff all checks passed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-seq}
LOGS=${OUT:-$BUILD}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CXX=${CXX:-g++}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$BUILD" "$LOGS"

ARCH=(-gencode=arch=compute_90a,code=sm_90a)
NVFLAGS=(-std=c++20 -O3 "${ARCH[@]}" -I"$ROOT" -Xcompiler=-Wall,-Wextra -Xptxas=-v,-warn-spills)
CXXFLAGS=(-std=c++20 -O3 -march=native -Wall -Wextra -Wno-unused-parameter -I"$ROOT" -I"$ROOT/tests/cuda/shim")

KERNELS=(SsdScan SsdScanBackward Attention AttentionBackward)
ORACLE=(SsdScan SsdScanBackward Attention)

echo "== build ($("$NVCC" --version | tail -1))"
pids=()
for k in "${KERNELS[@]}"; do
  "$NVCC" "${NVFLAGS[@]}" -c "$ROOT/runtime/kernels/cuda/$k.cu" -o "$BUILD/$k.o" \
    >"$BUILD/$k.ptxas.log" 2>&1 &
  pids+=($!)
done
for k in "${ORACLE[@]}"; do
  "$CXX" "${CXXFLAGS[@]}" -c "$ROOT/runtime/kernels/cpu/$k.cpp" -o "$BUILD/cpu_$k.o" &
  pids+=($!)
done
"$NVCC" -std=c++20 -O3 "${ARCH[@]}" -I"$ROOT" -I"$ROOT/tests/cuda/shim" -Xcompiler=-Wall,-Wextra \
  -c "$ROOT/tests/cuda/test_sequence_kernels.cu" -o "$BUILD/test_sequence_kernels.o" &
pids+=($!)
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
cat "$BUILD"/*.ptxas.log >"$LOGS/ptxas.log"
if [ "$fail" != 0 ]; then
  cat "$LOGS/ptxas.log" | grep -v "^ptxas info" || true
  echo "build failed"
  exit 2
fi
# Registers, spills and shared memory per kernel (short form).
grep -E "Compiling entry|registers|spill" "$LOGS/ptxas.log" \
  | sed -E 's/.*entry function .*(ssd_[a-z_]+|attn_[a-z_]+)kernelI?([^ ]*).*/\1 \2/' >"$LOGS/ptxas_summary.txt" || true
OBJS=("$BUILD/test_sequence_kernels.o")
for k in "${KERNELS[@]}"; do OBJS+=("$BUILD/$k.o"); done
for k in "${ORACLE[@]}"; do OBJS+=("$BUILD/cpu_$k.o"); done
"$NVCC" "${ARCH[@]}" -o "$BUILD/test_sequence_kernels" "${OBJS[@]}" -lpthread

if command -v cuobjdump >/dev/null; then
  for k in "${KERNELS[@]}"; do
    printf '%-20s HMMA %5d  LDSM %5d  LDGSTS %5d  LDL/STL %3d\n' "$k" \
      "$(cuobjdump --dump-sass "$BUILD/$k.o" | grep -c HMMA || true)" \
      "$(cuobjdump --dump-sass "$BUILD/$k.o" | grep -c LDSM || true)" \
      "$(cuobjdump --dump-sass "$BUILD/$k.o" | grep -c LDGSTS || true)" \
      "$(cuobjdump --dump-sass "$BUILD/$k.o" | grep -cE '\b(LDL|STL)\b' || true)"
  done | tee "$LOGS/sass_summary.txt"
fi

echo "== run"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>/dev/null || true
set +e
"$BUILD/test_sequence_kernels" "$@" 2>&1 | tee "$LOGS/test_sequence_kernels.log"
rc=${PIPESTATUS[0]}
set -e
exit "$rc"

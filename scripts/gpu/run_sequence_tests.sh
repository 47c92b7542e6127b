#!/usr/bin/env bash
# Builds and runs the CUDA sequence-kernel test (Mamba2 SSD scan, causal GQA attention: correctness
# against the CPU oracle, then timing against shared/reference/anchors.md) on a GPU machine, with
# plain nvcc and the host compiler: no CMake, no Abseil (the oracle's Kernels.h gets the shim in
# tests/cuda/shim). Everything it needs is in the repository: nothing else has to travel.
#
#   scripts/gpu/run_sequence_tests.sh [test args...]      e.g. --seed 42, --no-timing, --only ssd
#
# Environment: BUILD_DIR (default build-seq), JOBS (parallel compiles, default nproc), NVCC;
# ATTN_IMPLS (default "hopper hopper-det fa2"): the attention implementations to compare, one
# test process each (--impl NAME; a fault in one cannot take the others down), each under
# `timeout ${IMPL_TIMEOUT:-240}`; ATTN_IMPLS="" runs the test once with the library default.
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

KERNELS=(SsdScan SsdScanBackward SsdInitialState SsdInitialStateBackward Attention AttentionBackward AttentionHopper)
ORACLE=(SsdScan SsdScanBackward SsdInitialState Attention)

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

# ptxas remarks that matter for the wgmma kernels (serialised wgmma, setmaxnreg ignored, spills).
grep -E "C75[0-9][0-9]|spill" "$LOGS/ptxas.log" | grep -v " 0 bytes spill" | sed -E 's/_ZN[^ ]*(attn_[a-z_]+kernel[^ ]*)/\1/' \
  | sort | uniq -c | head -20 || true
grep -E "entry function|Used [0-9]+ registers" "$BUILD/AttentionHopper.ptxas.log" \
  | sed -E 's/.*entry function .*(attn_[a-z_]+kernel)(ILb[01]E)?.*/\1\2/; s/ptxas info *: //' | paste - - || true

if command -v cuobjdump >/dev/null; then
  for k in "${KERNELS[@]}"; do
    cuobjdump --dump-sass "$BUILD/$k.o" >"$BUILD/$k.sass" 2>/dev/null || true
    printf '%-20s HGMMA %5d  HMMA %5d  LDSM %5d  LDGSTS %5d  UTMALDG %3d  SETMAXREG %2d  LDL/STL %3d\n' "$k" \
      "$(grep -c HGMMA "$BUILD/$k.sass" || true)" \
      "$(grep -c HMMA "$BUILD/$k.sass" || true)" \
      "$(grep -c LDSM "$BUILD/$k.sass" || true)" \
      "$(grep -c LDGSTS "$BUILD/$k.sass" || true)" \
      "$(grep -c UTMALDG "$BUILD/$k.sass" || true)" \
      "$(grep -c SETMAXREG "$BUILD/$k.sass" || true)" \
      "$(grep -cE '\b(LDL|STL)\b' "$BUILD/$k.sass" || true)"
  done | tee "$LOGS/sass_summary.txt"
  # HGMMA per Hopper kernel (function headers in the dump start with "Function : ").
  awk '/Function : /{f=$3} /HGMMA/{n[f]++} END{for (k in n) printf "  %6d HGMMA  %s\n", n[k], k}' \
    "$BUILD/AttentionHopper.sass" | sed -E 's/_ZN[^ ]*(attn_[a-z_]+kernel[^ ]*)/\1/' || true
fi

echo "== run"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>/dev/null || true
IMPLS=${ATTN_IMPLS-hopper hopper-det fa2}
set +e
if [ -z "$IMPLS" ]; then
  "$BUILD/test_sequence_kernels" "$@" 2>&1 | tee "$LOGS/test_sequence_kernels.log"
  rc=${PIPESTATUS[0]}
  exit "$rc"
fi
rc=0
summary=()
for impl in $IMPLS; do
  echo "== run --impl $impl"
  timeout "${IMPL_TIMEOUT:-240}" "$BUILD/test_sequence_kernels" --impl "$impl" "$@" 2>&1 \
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

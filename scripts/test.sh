#!/usr/bin/env bash
# The test command: installs what is missing, builds into build/ (tools in build/bin/), runs the
# lit and GoogleTest suites through ctest, then builds the runtime under AddressSanitizer and
# UndefinedBehaviorSanitizer (build-sanitize/) and runs its tests again.
#   scripts/test.sh                 everything
#   scripts/test.sh --no-sanitize   skip the sanitizer build
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=1
for arg in "$@"; do
  case "$arg" in
    --no-sanitize) sanitize=0 ;;
    *) echo "usage: scripts/test.sh [--no-sanitize]" >&2; exit 2 ;;
  esac
done

jobs=$(nproc)
scripts/install-deps.sh

echo "== build (build/)"
# The GPU test programs (tests/cuda) are for the GPU machines (scripts/gpu/make_bundle.sh).
cmake --preset default -DHYBRIDCP_BUILD_GPU_TESTS=OFF >/dev/null
cmake --build --preset default -j"$jobs"
echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "$sanitize" -eq 1 ]; then
  echo "== runtime tests under ASan + UBSan (build-sanitize/)"
  # Its command-line test compiles plans with build/bin/hybridcp (the sanitize build has no compiler).
  cmake --preset sanitize -DHYBRIDCP_PLAN_COMPILER="$PWD/build/bin/hybridcp" >/dev/null
  cmake --build --preset sanitize -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-sanitize --output-on-failure -j"$jobs"
fi
echo "== all tests passed"

#!/usr/bin/env bash
# Keeps the bundle's current hybridcp (stripped, compressed) as the "base" that
# scripts/gpu/compare_steps.sh runs beside the next bundle's, in the same call on the same GPU:
# run it before rebuilding the bundle with the change to measure.
#   scripts/gpu/keep_base.sh && scripts/gpu/make_bundle.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$ROOT/build-gpu/bundle/bin/hybridcp
[ -x "$BIN" ] || { echo "keep_base.sh: no bundle yet ($BIN): run scripts/gpu/make_bundle.sh" >&2; exit 1; }
mkdir -p "$ROOT/build-gpu/carry/base"
strip -o "$ROOT/build-gpu/carry/base/hybridcp" "$BIN"
gzip -f "$ROOT/build-gpu/carry/base/hybridcp"
echo "kept the bundle's hybridcp of $(date -r "$BIN" "+%F %T") as the base: build-gpu/carry/base/hybridcp.gz"

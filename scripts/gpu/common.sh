# Sourced by the scripts/gpu/run_*.sh scripts that run from a bundle (scripts/gpu/make_bundle.sh):
# the library path, the log and the `run` helper. Expects BUNDLE and LOG to be set.

# The bundle travels compressed (make_bundle.sh's build-gpu/carry/bundle.tar.gz, carried as
# build-gpu/carry): unpacked beside it unless the bundle there is newer (carried as it is).
packed="$(dirname "$BUNDLE")/carry/bundle.tar.gz"
if [ -f "$packed" ] && [ "$packed" -nt "$BUNDLE" ]; then
  rm -rf "$BUNDLE"
  tar -C "$(dirname "$BUNDLE")" -xzf "$packed"
  touch "$BUNDLE"
fi
LIBS="$BUNDLE/lib:/usr/local/cuda/lib64"
# The machine's own OpenMPI if it has one (it matches its mpirun); Debian's copy otherwise.
ldconfig -p | grep -q 'libmpi\.so\.40' || LIBS="$LIBS:$BUNDLE/lib/mpi"
export LD_LIBRARY_PATH="$LIBS:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on these machines
status=0

# Runs a command, its output to stdout and $LOG; a non-zero exit sets status=1.
run() {
  echo "== $(date +%T) $*" | tee -a "$LOG"
  "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "== $(date +%T) exit $rc" | tee -a "$LOG"
  [ "$rc" -eq 0 ] || status=1
}

# A job that must fail: within 60 s, not zero, its output matching $1.
expect_failure() {
  local pattern=$1 start output rc
  shift
  echo "== $(date +%T) (must fail within 60 s, matching '$pattern') $*" | tee -a "$LOG"
  start=$(date +%s)
  output=$(timeout 100 "$@" 2>&1)
  rc=$?
  local elapsed=$(($(date +%s) - start))
  echo "$output" | tail -8 | tee -a "$LOG"
  grep "$pattern" <<<"$output" | head -2 | sed 's/^/   matched: /' | tee -a "$LOG"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$elapsed" -lt 60 ] && grep -q "$pattern" <<<"$output"; then
    echo "== PASS: ended with status $rc after ${elapsed} s" | tee -a "$LOG"
  else
    echo "== FAIL: status $rc after ${elapsed} s" | tee -a "$LOG"
    status=1
  fi
}

# The base hybridcp that scripts/gpu/keep_base.sh kept, unpacked: sets BASE to its path, or to
# nothing (with a message in $LOG) when none was kept.
unpack_base() {
  local packed
  packed="$(dirname "$BUNDLE")/carry/base/hybridcp.gz"
  BASE=/tmp/hybridcp-base
  if [ -f "$packed" ]; then
    gunzip -c "$packed" >"$BASE" && chmod +x "$BASE"
  else
    echo "no base (scripts/gpu/keep_base.sh): the new binary alone" | tee -a "$LOG"
    BASE=""
  fi
}

#!/usr/bin/env bash
# Installs every Debian package the build and the tests need. Idempotent: skips
# the work when everything is already present. Run as root or with sudo.
set -euo pipefail

packages=(
  build-essential cmake ninja-build git pkg-config python3
  llvm-22-dev llvm-22-tools libmlir-22-dev mlir-22-tools
  libabsl-dev nlohmann-json3-dev flatbuffers-compiler libflatbuffers-dev
  libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev libpcre2-dev
  clang-format
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"

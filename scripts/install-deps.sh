#!/usr/bin/env bash
# Installs every Debian package k3 builds, tests and benchmarks with. Idempotent:
# does nothing (and needs no network) when all are present. Run as root or with sudo.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libcli11-dev libsimdjson-dev libxxhash-dev xxhash liburing-dev
  libvulkan-dev libvulkan-volk-dev glslc mesa-vulkan-drivers vulkan-validationlayers spirv-tools
  doctest-dev libpcre2-dev libopenblas-dev
  clang libclang-rt-14-dev libomp-dev fio
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

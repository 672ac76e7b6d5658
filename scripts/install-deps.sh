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
  python3-jsonschema
  chromium nodejs
  libopenmpi-dev openmpi-bin
)
if [ "$(dpkg --print-architecture)" = amd64 ]; then
  # aarch64 cross build + qemu-user run (scripts/test-arm64.sh): the arm64
  # multiarch packages of every library k3 links (headers-only CLI11 and doctest
  # are architecture-independent), and libgomp1 for OpenMP at run time.
  # simdjson: only the arm64 shared library, never libsimdjson-dev:arm64, which
  # is not Multi-Arch: same and would REMOVE the amd64 libsimdjson-dev
  # (cmake/aarch64-simdjson/ explains how the cross build finds it).
  # (On an arm64 host the list above is already the native aarch64 build.)
  PACKAGES+=(
    crossbuild-essential-arm64 qemu-user-static
    libsimdjson14:arm64 libstdc++6:arm64 libxxhash-dev:arm64 liburing-dev:arm64
    libpcre2-dev:arm64 libgomp1:arm64
  )
fi

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
if [[ " ${missing[*]}" == *":arm64"* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64  # before the update, so apt lists arm64 packages
fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

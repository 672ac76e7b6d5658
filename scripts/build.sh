#!/usr/bin/env bash
# Configures and builds k3 (Release, portable) into ${K3_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${K3_BUILD_DIR:-build}
JOBS=${K3_JOBS:-2}
LAUNCHER=()
# ccache, when present, lets several checkouts (git worktrees) share objects.
if command -v ccache >/dev/null 2>&1; then
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${K3_BUILD_TYPE:-Release} "${LAUNCHER[@]}" "$@" >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS"

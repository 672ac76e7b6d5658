#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds, runs every ctest label
# (unit, golden, slow), then the unit suite again with the scalar kernels forced,
# the aarch64 cross build under qemu-user (scripts/test-arm64.sh) and the fuzzers.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR=${K3_BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j2
echo "== unit suite with K3_FORCE_ISA=scalar"
K3_FORCE_ISA=scalar ctest --output-on-failure -j2 -L unit
echo "== aarch64: cross build, unit label and repack / verify / generate under qemu-user"
(cd "$OLDPWD" && scripts/test-arm64.sh)
echo "== fuzzing the untrusted-input parsers (clang, ASan/UBSan, ${K3_FUZZ_SECONDS:-30}s per target)"
cd "$OLDPWD"
scripts/fuzz.sh

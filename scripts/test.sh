#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds, runs every ctest label
# (unit, golden, slow) on the ISA the kernels pick, then the unit and golden
# suites again on every other ISA this CPU runs (K3_FORCE_ISA), a short
# differential pass against the npm tiktoken, the aarch64 cross build under
# qemu-user (scripts/test-arm64.sh) and the fuzzers.
# CI=true (set by .ci/run) turns the skips of data a user's clone may lack
# (../shared/oracle, node/npm for tiktoken) into failures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR=${K3_BUILD_DIR:-build}
CTEST=(ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j2)
"${CTEST[@]}"

# The ISAs this CPU runs, by the rules of lib/quant/src/isa.cc (which reads the
# same CPUID bits; a name it disagrees on fails loudly under K3_FORCE_ISA), in
# kAllIsas order, so the last one is what the run above used.
isas=(scalar)
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true) "
has() { [[ $flags == *" $1 "* ]]; }
if has avx2 && has fma; then
  isas+=(avx2)
  if has avx_vnni; then isas+=(avx2vnni); fi
fi
if has avx512f && has avx512bw && has avx512vl && has avx512_vnni && has fma; then isas+=(avx512); fi
# aarch64 hosts list "Features" (asimd, asimddp) instead of x86 "flags".
flags=" $(grep -m1 '^Features' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true) "
if has asimd; then
  isas+=(neon)
  if has asimddp; then isas+=(neondot); fi
fi
best=${isas[${#isas[@]}-1]}
echo "== kernel ISAs on this CPU: ${isas[*]}; the run above used $best"
# Per-ISA loops inside the tests cover only the forced ISA, so each rerun is
# short. The two I/O suites (streaming store, repack crash/kill/disk-full) run
# once above: their kernels are the quantizers and matmuls that quant_test,
# quant_oracle_test and the goldens check on every ISA here.
for isa in "${isas[@]}"; do
  if [[ $isa == "$best" ]]; then continue; fi
  echo "== unit and golden suites with K3_FORCE_ISA=$isa"
  K3_FORCE_ISA=$isa "${CTEST[@]}" -L 'unit|golden' -E '^(stream_store_test|repack_integration_test)$'
done

# Random strings (seeded) encoded by OpenAI's tiktoken (npm, pinned, installed
# once into .cache/) and by k3: every id must agree.
tiktoken_strings=${K3_TIKTOKEN_STRINGS:-4000}
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  echo "== tiktoken differential pass: $tiktoken_strings strings + specials"
  BUILD_DIR=$BUILD_DIR lib/tokenizer/tools/tiktoken-fuzz.sh "$tiktoken_strings" "${K3_TIKTOKEN_SEED:-1}"
elif [[ ${CI:-} == true ]]; then
  echo "CI=true but node/npm are missing: the tiktoken differential pass cannot run" >&2
  exit 1
else
  echo "SKIPPED: tiktoken differential pass: node/npm not installed (CI=true makes this fail)"
fi

echo "== aarch64: cross build, unit label and repack / verify / generate under qemu-user"
scripts/test-arm64.sh

echo "== fuzzing the untrusted-input parsers (clang, ASan/UBSan, ${K3_FUZZ_SECONDS:-12}s per target)"
scripts/fuzz.sh

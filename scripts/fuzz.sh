#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang + ASan/UBSan into
# ${K3_FUZZ_BUILD_DIR:-build-fuzz} and runs each for ${K3_FUZZ_SECONDS:-12} s from
# the committed seed corpus. New inputs go to a temporary directory, so the
# repository stays clean; a crash leaves its reproducer in build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${K3_FUZZ_BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${K3_FUZZ_SECONDS:-12}
JOBS=${K3_JOBS:-2}

# The top-level CMakeLists finds OpenMP; with clang that is libomp (not pulled in
# by the clang package itself).
if ! dpkg-query -W -f='${Status}' libomp-dev 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends libomp-dev
fi

CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DK3_FUZZ=ON -DK3_SANITIZE=ON -DK3_BUILD_TESTS=OFF -DK3_BUILD_BENCH=OFF >/dev/null
# target:max_len[:dict]; seeds in fuzz/corpus/<target without _fuzz>.
SPECS=(safetensors_header_fuzz:4096:fuzz/safetensors.dict
       checkpoint_file_fuzz:4096:fuzz/checkpoint_file.dict
       tiktoken_model_fuzz:16384
       tokenizer_config_fuzz:4096
       chat_request_fuzz:4096:fuzz/chat.dict
       config_json_fuzz:8192
       index_json_fuzz:4096
       constrain_schema_fuzz:4096:fuzz/constrain_schema.dict
       server_request_fuzz:4096:fuzz/server_request.dict
       messages_request_fuzz:4096:fuzz/messages_request.dict
       http_head_fuzz:4096:fuzz/http_head.dict)
TARGETS=()
for s in "${SPECS[@]}"; do TARGETS+=("${s%%:*}"); done
cmake --build "$BUILD_DIR" -j"$JOBS" --target "${TARGETS[@]}"

mkdir -p "$BUILD_DIR/artifacts"
for s in "${SPECS[@]}"; do
  IFS=: read -r t max_len dict <<<"$s"
  seeds=fuzz/corpus/${t%_fuzz}
  work=$(mktemp -d /tmp/k3_fuzz_${t}.XXXXXX)
  echo "== fuzzing $t for ${FUZZ_SECONDS}s (seeds: $seeds)"
  "$BUILD_DIR/bin/$t" -max_total_time="$FUZZ_SECONDS" -max_len="$max_len" -rss_limit_mb=2048 \
    ${dict:+-dict=$dict} -print_final_stats=1 -artifact_prefix="$BUILD_DIR/artifacts/" \
    "$work" "$seeds"
  rm -rf "$work"
done
echo "fuzz: all targets ran clean"

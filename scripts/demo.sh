#!/usr/bin/env bash
# The main job on the embedded tiny model: install, build, check the snapshot,
# repack, verify, generate, and serve one question over HTTP. Output goes to ${K3_DEMO_DIR:-/tmp/k3-demo}.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BIN=${K3_BUILD_DIR:-build}/bin
MODEL=tests/data/oracle/k3-tiny
OUT=${K3_DEMO_DIR:-/tmp/k3-demo}
mkdir -p "$OUT"
echo "== k3-fixture: check the embedded tiny snapshot"
"$BIN/k3-fixture" check "$MODEL"
echo "== k3-fixture: generate a K3-shaped tiny snapshot from scratch (own weights and tokenizer) and check it"
"$BIN/k3-fixture" --preset tiny --out "$OUT/fixture-tiny" --seed 1 --force -q
"$BIN/k3-fixture" check "$OUT/fixture-tiny"
echo "== k3-repack: convert the snapshot into an int8 container (experts byte-identical, id-ordered)"
rm -rf "$OUT/container"
"$BIN/k3-repack" "$MODEL" "$OUT/container" --bits 8
echo "== k3-verify: structure, index, checksums, and every byte against the source"
"$BIN/k3-verify" "$OUT/container" --full --source "$MODEL"
echo "== xxhsum: the container's checksums verify without k3 at all"
(cd "$OUT/container" && xxhsum -H2 -c checksums.xxh128 | tail -n 3)
echo "== k3-run generate: 16 greedy tokens from the container, streamed as text"
"$BIN/k3-run" generate "$OUT/container" "Hello, K3! 你好" --ngen 16
echo "== k3-run render + chat: one XTML chat turn on the container"
"$BIN/k3-run" chat "$OUT/container" "What is 2+2?" --max-tokens 24 --temp 0
echo "== k3-run serve: the OpenAI-compatible server on a free port, one question with curl, stopped by PID"
"$BIN/k3-run" serve "$OUT/container" --port 0 --model-id k3-tiny >"$OUT/serve.log" 2>&1 &
SERVE_PID=$!
trap 'kill "$SERVE_PID" 2>/dev/null || true' EXIT
PORT=
for _ in $(seq 300); do
  PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$OUT/serve.log" | head -1)
  [ -n "$PORT" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] && break
  sleep 0.1
done
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"k3-tiny","messages":[{"role":"user","content":"What is 2+2?"}],"max_tokens":16,"temperature":0}'
echo
kill "$SERVE_PID"
wait "$SERVE_PID" 2>/dev/null || true
trap - EXIT
echo "== done: outputs in $OUT"

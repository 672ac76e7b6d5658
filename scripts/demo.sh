#!/usr/bin/env bash
# The main job on the embedded tiny model: install, build, check the snapshot,
# repack, verify and generate. Output goes to ${K3_DEMO_DIR:-/tmp/k3-demo}.
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

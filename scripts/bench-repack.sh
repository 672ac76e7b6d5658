#!/usr/bin/env bash
# Conversion benchmark (docs/PERFORMANCE.md, "Conversion"): writes a multi-GB
# real-layer fixture once, then runs `k3-bench repack` (k3-repack vs cp, k3-verify
# --full vs cat, page cache dropped before every step). Needs root for
# drop_caches; set K3_BENCH_NO_DROP=1 to run without (numbers then include cache).
# Usage: scripts/bench-repack.sh [WORK_DIR] [RUNS] [EXPERTS]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${K3_BUILD_DIR:-build}/bin
WORK=${1:-.fixtures/bench-repack}
RUNS=${2:-3}
EXPERTS=${3:-192}
SRC=.fixtures/real-layer-$EXPERTS
mkdir -p "$WORK"
if [ ! -f "$SRC/model.safetensors.index.json" ]; then
  "$BIN/k3-fixture" --preset real-layer --experts "$EXPERTS" --out "$SRC" --quiet
fi
DROP=--drop-caches
[ "${K3_BENCH_NO_DROP:-0}" = 1 ] && DROP=
echo "{\"git\":\"$(git rev-parse --short=12 HEAD)\",\"cpu\":\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\",\"cpus\":$(nproc)}"
"$BIN/k3-bench" repack --src "$SRC" --work "$WORK" --runs "$RUNS" $DROP

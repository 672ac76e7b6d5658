#!/usr/bin/env bash
# Constrained-decoding mask cost: k3-bench constrain on the k3-tiny model and
# vocabulary, plus a real-size vocabulary: the first RANKS (default 163,840, K3's
# rank count) ranks of OpenAI's o200k_base encoding, taken as data from the npm
# `tiktoken` package (MIT licence) and written as a tiktoken.model directory.
# Prints k3-bench's JSON lines.
#
#   scripts/bench-constrain.sh [RANKS] [RUNS]
#
# BUILD_DIR (env, default build) must hold bin/k3-bench. The npm package and the
# vocabulary go to .cache/ (git-ignored).
set -euo pipefail
. "$(dirname "$0")/bench-common.sh"
ranks="${1:-163840}"
runs="${2:-5}"
work="$root/.cache/constrain-vocab"
k3_bench_bin
k3_npm_tiktoken "$work"
vocab="$work/o200k-$ranks"
if [[ ! -f "$vocab/tiktoken.model" ]]; then
  mkdir -p "$vocab"
  # bpe_ranks is tiktoken's compact form: per line "<name> <first rank> <base64>...".
  /usr/bin/python3 - "$work/node_modules/tiktoken/encoders/o200k_base.json" "$vocab" "$ranks" <<'PY'
import json, sys
src, out, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
ranks = {}
for line in json.load(open(src))["bpe_ranks"].split("\n"):
    parts = line.split(" ")
    if len(parts) < 2:
        continue
    first = int(parts[1])
    for i, tok in enumerate(parts[2:]):
        ranks[first + i] = tok
assert len(ranks) >= limit, f"o200k_base has only {len(ranks)} ranks"
with open(out + "/tiktoken.model.tmp", "w") as f:
    for r in range(limit):
        f.write(f"{ranks[r]} {r}\n")
with open(out + "/tokenizer_config.json", "w") as f:
    json.dump({"added_tokens_decoder": {}}, f)
import os
os.rename(out + "/tiktoken.model.tmp", out + "/tiktoken.model")
PY
fi
"$bench_bin" constrain "$root/tests/data/oracle/k3-tiny" --vocab-dir "$vocab" --runs "$runs"

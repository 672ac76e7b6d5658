#!/usr/bin/env bash
# Constrained-decoding mask cost: k3-bench constrain on the k3-tiny model and
# vocabulary, plus a real-size vocabulary: the first RANKS (default 163,840, K3's
# rank count) ranks of OpenAI's o200k_base encoding, taken as data from the npm
# `tiktoken` package (MIT licence) and written as a tiktoken.model directory.
# Also writes o200k-RANKS-xtml (the same ranks with K3's specials) for
# `k3-bench structured --vocab-dir`. Prints k3-bench's JSON lines.
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
# The same ranks with K3's special tokens (the tiny model's added_tokens_decoder
# moved to ids RANKS..RANKS+255): what `k3-bench structured --vocab-dir` needs.
if [[ ! -f "$vocab-xtml/tiktoken.model" ]]; then
  mkdir -p "$vocab-xtml"
  /usr/bin/python3 - "$root/tests/data/oracle/k3-tiny/tokenizer_config.json" "$vocab-xtml" "$ranks" <<'PY'
import json, sys
src, out, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = json.load(open(src))
added = cfg["added_tokens_decoder"]
first = min(int(k) for k in added)
cfg["added_tokens_decoder"] = {str(int(k) - first + ranks): v for k, v in added.items()}
with open(out + "/tokenizer_config.json", "w") as f:
    json.dump(cfg, f)
PY
  cp "$vocab/tiktoken.model" "$vocab-xtml/tiktoken.model.tmp"
  mv "$vocab-xtml/tiktoken.model.tmp" "$vocab-xtml/tiktoken.model"
fi
"$bench_bin" constrain "$root/tests/data/oracle/k3-tiny" --vocab-dir "$vocab" --runs "$runs"

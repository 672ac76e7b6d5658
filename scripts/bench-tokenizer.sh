#!/usr/bin/env bash
# Tokenizer throughput: k3 vs OpenAI's tiktoken (npm package, Rust compiled to
# WASM) on the same vocabulary, pattern and text, one thread each, in one run.
# Prints k3-bench's JSON line (median of RUNS, ratio_vs_baseline, same_ids); the
# baseline process runs once per timed run, interleaved with k3's runs.
#
#   scripts/bench-tokenizer.sh [MODEL_DIR] [CORPUS_MB] [RUNS]
#
# MODEL_DIR defaults to the k3-tiny oracle vocabulary; BUILD_DIR (env, default
# build) must hold bin/k3-bench. The npm package goes to .cache/ (git-ignored).
set -euo pipefail
. "$(dirname "$0")/bench-common.sh"
model="${1:-$root/tests/data/oracle/k3-tiny}"
corpus_mb="${2:-8}"
runs="${3:-7}"
work="$root/.cache/bench-tokenizer"
k3_bench_bin
command -v node >/dev/null || { echo "node is required for the tiktoken baseline" >&2; exit 2; }
k3_npm_tiktoken "$work"

# A mixed corpus: every oracle tokenizer and chat text (prose, code, CJK, emoji,
# whitespace runs) plus the repository's own sources and docs, repeated to size.
cat > "$work/make_corpus.cjs" <<'JS'
const fs = require("fs"), path = require("path");
const [root, out, mb] = process.argv.slice(2);
const parts = [];
const tok = JSON.parse(fs.readFileSync(path.join(root, "tests/data/oracle/tokenizer/cases.json")));
for (const c of tok.cases) parts.push(c.text);
const chat = JSON.parse(fs.readFileSync(path.join(root, "tests/data/oracle/chat/cases.json")));
for (const c of chat.cases) parts.push(c.text);
const walk = (dir) => {
  for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name < b.name ? -1 : 1)) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p);
    else if (/\.(cc|h|md)$/.test(e.name)) parts.push(fs.readFileSync(p, "utf8"));
  }
};
for (const d of ["lib", "apps", "docs"]) if (fs.existsSync(path.join(root, d))) walk(path.join(root, d));
const unit = parts.join("\n");
let text = "";
while (Buffer.byteLength(text) < mb * 1e6) text += unit;
fs.writeFileSync(out, text);
JS
node "$work/make_corpus.cjs" "$root" "$work/corpus.txt" "$corpus_mb"

# The baseline: tiktoken built from the same tiktoken.model, specials and pattern.
cat > "$work/tiktoken_bench.cjs" <<'JS'
const fs = require("fs"), path = require("path");
const { Tiktoken } = require(path.join(__dirname, "node_modules/tiktoken"));
const [model, corpus, runs, patFile] = process.argv.slice(2);
const lines = fs.readFileSync(path.join(model, "tiktoken.model"), "utf8").split("\n").filter(Boolean);
const tokens = [];
for (const l of lines) { const [b64, rank] = l.split(" "); tokens[+rank] = b64; }
const cfg = JSON.parse(fs.readFileSync(path.join(model, "tokenizer_config.json")));
const specials = {};
for (let k = 0; k < 256; k++) {
  const id = tokens.length + k, e = (cfg.added_tokens_decoder || {})[String(id)];
  specials[e ? e.content : `<|reserved_token_${id}|>`] = id;
}
const pat = JSON.parse(fs.readFileSync(patFile)).pat_str;
const enc = new Tiktoken("! 0 " + tokens.join(" "), specials, pat);
const text = fs.readFileSync(corpus, "utf8");
// Kimi's tokenization_kimi.py wrapper around tiktoken, which k3 implements too:
// slices of 400,000 code points, each cut inside runs of more than 25,000
// whitespace (str.isspace) or non-whitespace code points.
const isSpace = (c) => (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c === 0x85 || c === 0xa0 ||
  c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f ||
  c === 0x205f || c === 0x3000;
function kimiEncode(text) {
  const out = [];
  const push = (s) => { for (const id of enc.encode_ordinary(s)) out.push(id); };
  const n = text.length;
  let i = 0;
  do {
    let j = i, count = 0;
    while (j < n && count < 400000) { j += text.codePointAt(j) > 0xffff ? 2 : 1; count++; }
    let start = i, run = 0, runSpace = null;
    for (let k = i; k < j;) {
      const c = text.codePointAt(k), sp = isSpace(c);
      if (sp !== runSpace) { runSpace = sp; run = 1; }
      else if (++run > 25000) { push(text.slice(start, k)); start = k; run = 1; }
      k += c > 0xffff ? 2 : 1;
    }
    push(text.slice(start, j));
    i = j;
  } while (i < n);
  return out;
}
let ids = kimiEncode(text);  // warm-up
const times = [];
for (let r = 0; r < +runs; r++) {
  const t0 = process.hrtime.bigint();
  ids = kimiEncode(text);
  times.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
times.sort((a, b) => a - b);
let h = 0;
for (const id of ids) h = (Math.imul(h, 31) + id) >>> 0;
const med = times[times.length >> 1];
console.log(JSON.stringify({ impl: "tiktoken-npm-wasm", version: require(path.join(__dirname, "node_modules/tiktoken/package.json")).version,
  node: process.version, runs: +runs, median_s: med, tokens: ids.length, ids_hash: h,
  mb_per_s: Buffer.byteLength(text) / med / 1e6 }));
enc.free();
JS

# One thread for both: node's WASM encode is single-threaded; pin the process.
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
"${pin[@]}" "$bench_bin" tokenizer "$model" --corpus "$work/corpus.txt" --runs "$runs" \
  --baseline-cmd "${pin[*]} node '$work/tiktoken_bench.cjs' '$model' '$work/corpus.txt' 1 '$root/tests/data/oracle/tokenizer/cases.json'"

#!/usr/bin/env bash
# Differential check against tiktoken itself: random strings drawn from all of
# Unicode (ASCII-heavy, with CJK, marks, emoji, new scripts and contractions) are
# encoded by tiktoken 1.0.22 (npm) with the k3-tiny vocabulary, plus COUNT/5
# strings dense with special-token names (encoded with and without specials
# allowed); then tokenizer_test compares k3's ids with every one of them.
#
#   lib/tokenizer/tools/tiktoken-fuzz.sh [COUNT] [SEED]      (BUILD_DIR, default build)
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
count="${1:-50000}"
seed="${2:-1}"
build="${BUILD_DIR:-$root/build}"
work="$root/.cache/bench-tokenizer"
mkdir -p "$work"
if [[ ! -f "$work/node_modules/tiktoken/package.json" ]]; then
  [[ -f "$work/package.json" ]] || echo '{"private": true}' > "$work/package.json"
  (cd "$work" && npm install --silent --no-audit --no-fund tiktoken@1.0.22 >&2)
fi
cat > "$work/fuzz_strings.cjs" <<'JS'
const fs = require("fs"), path = require("path");
const { Tiktoken } = require(path.join(__dirname, "node_modules/tiktoken"));
const [model, casesFile, n, seed0, out] = process.argv.slice(2);
const lines = fs.readFileSync(path.join(model, "tiktoken.model"), "utf8").split("\n").filter(Boolean);
const tokens = [];
for (const l of lines) { const [b64, rank] = l.split(" "); tokens[+rank] = b64; }
const cfg = JSON.parse(fs.readFileSync(path.join(model, "tokenizer_config.json")));
const specials = {}, names = [];
for (let k = 0; k < 256; k++) {
  const id = tokens.length + k, e = (cfg.added_tokens_decoder || {})[String(id)];
  const name = e ? e.content : `<|reserved_token_${id}|>`;
  specials[name] = id;
  names.push(name);
}
const enc = new Tiktoken("! 0 " + tokens.join(" "), specials, JSON.parse(fs.readFileSync(casesFile)).pat_str);
let s = +seed0 >>> 0;
const rnd = () => { s = (Math.imul(s, 1103515245) + 12345) >>> 0; return s / 4294967296; };
// Code point pools: ASCII, Latin/Greek/Cyrillic, marks, punctuation, CJK and its
// symbols, kana, Han extensions, emoji, the scripts Unicode 15-16 added, tags.
const pools = [[0x20, 0x7e], [0x9, 0xd], [0x80, 0x2ff], [0x300, 0x36f], [0x370, 0x1fff], [0x2000, 0x206f],
  [0x2e80, 0x2fff], [0x3000, 0x303f], [0x3040, 0x30ff], [0x3400, 0x4dbf], [0x4e00, 0x9fff], [0xa000, 0xd7ff],
  [0xe000, 0xffff], [0x10000, 0x1ffff], [0x1f300, 0x1faff], [0x20000, 0x323af], [0x323b0, 0x3347f],
  [0x10d40, 0x10d8f], [0x11380, 0x113ff], [0x13460, 0x143ff], [0x16100, 0x1613f], [0x1e5d0, 0x1e5ff],
  [0xe0000, 0xe01ef]];
const extra = ["'s", "'S", "'ll", "\r\n", "  ", "\u00a0", "\u0085", "123", "Ab"];
const outLines = [];
for (let i = 0; i < +n; i++) {
  let t = "";
  const len = 1 + Math.floor(rnd() * 40);
  for (let k = 0; k < len; k++) {
    if (rnd() < 0.1) { t += extra[Math.floor(rnd() * extra.length)]; continue; }
    const p = rnd() < 0.4 ? pools[0] : pools[Math.floor(rnd() * pools.length)];
    let c = p[0] + Math.floor(rnd() * (p[1] - p[0] + 1));
    if (c >= 0xd800 && c <= 0xdfff) c = 0x41;
    t += String.fromCodePoint(c);
  }
  outLines.push(JSON.stringify({ text: t, ids: Array.from(enc.encode_ordinary(t)) }));
}
// Special-token text, with specials allowed (tiktoken encode(text, "all")) and not.
const bits = ["hello", " ", "<|", "|>", "[", "]", "<|open", "open|>", "\n", "中文", "'s", "BOS", "<", "|", "x"];
for (let i = 0; i < Math.ceil(+n / 5); i++) {
  let t = "";
  const len = 1 + Math.floor(rnd() * 12);
  for (let k = 0; k < len; k++) {
    t += rnd() < 0.3 ? names[Math.floor(rnd() * (rnd() < 0.5 ? 24 : 256))] : bits[Math.floor(rnd() * bits.length)];
  }
  const allow = rnd() < 0.5;
  outLines.push(JSON.stringify({ text: t, allow_special: allow,
    ids: Array.from(allow ? enc.encode(t, "all") : enc.encode_ordinary(t)) }));
}
fs.writeFileSync(out, outLines.join("\n") + "\n");
JS
node "$work/fuzz_strings.cjs" "$root/tests/data/oracle/k3-tiny" "$root/tests/data/oracle/tokenizer/cases.json" \
  "$count" "$seed" "$work/fuzz.jsonl"
K3_TIKTOKEN_FUZZ_FILE="$work/fuzz.jsonl" "$build/bin/tokenizer_test" -tc="*tiktoken fuzz*"

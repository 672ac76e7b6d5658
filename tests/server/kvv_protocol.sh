#!/usr/bin/env bash
# Moonshot's Kimi-Vendor-Verifier, `protocol` group (72 cases), offline against
# `k3-run serve` on the tiny model (../shared/kvv/README.md). Every case must
# pass. Exit 77 (a skip ctest reports) only when no copy of the verifier is on
# this machine: set KVV_MIRROR and OPENAI_MIRROR (git copies) or run
# `../shared/kvv/run.sh setup` once.
#
# usage: kvv_protocol.sh K3_RUN MODEL_DIR
set -euo pipefail
k3_run=$1 model=$2
here=$(cd "$(dirname "$0")" && pwd)
kvv=${K3_KVV_DIR:-$here/../../../shared/kvv}
work=${KVV_WORK:-/tmp/kvv}
if [ ! -x "$kvv/run.sh" ]; then
  echo "SKIP: no KVV harness at $kvv (K3_KVV_DIR)"; exit 77
fi
if [ ! -d "$work/Kimi-Vendor-Verifier/.git" ] && [ -z "${KVV_MIRROR:-}" ]; then
  echo "SKIP: no verifier clone in $work and no KVV_MIRROR"; exit 77
fi
log=$(mktemp /tmp/k3-kvv-serve.XXXXXX.log)
# KVV sends no max_tokens: a small default cap keeps the 72 cases quick.
"$k3_run" serve "$model" --host 127.0.0.1 --port 0 --model-id k3-tiny --max-tokens 16 >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
port=
for _ in $(seq 600); do
  port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
  if [ -n "$port" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ]; then
    break
  fi
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "k3-run serve exited"; exit 1; }
  sleep 0.1
done
out=${OUT:-$work/out}
rc=0
SKIP_APT=${SKIP_APT:-1} MODEL=k3-tiny OUT=$out "$kvv/run.sh" "http://127.0.0.1:$port/v1" protocol -- -q || rc=$?
summary=$(/usr/bin/python3 - "$out/protocol.junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
s = r if r.tag == "testsuite" else r.find("testsuite")
n, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(f"{n} {n - f - e - k} {f} {e} {k}")
PY
)
read -r total passed failed errors skipped <<<"$summary"
echo "KVV protocol: $total cases, $passed passed, $failed failed, $errors errors, $skipped skipped"
[ "$rc" = 0 ] && [ "$total" = 72 ] && [ "$passed" = 72 ]

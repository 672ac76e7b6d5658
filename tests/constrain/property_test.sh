#!/usr/bin/env bash
# Constrained-decoding property test: 250 schemas (tests/constrain/schemas.json)
# x RUNS seeded random generations over the k3-tiny vocabulary, every output
# parsed and validated by python3-jsonschema (check_outputs.py).
# Usage: property_test.sh CONSTRAIN_DRIVE MODEL_DIR RUNS
set -euo pipefail
DRIVE=$1
MODEL=$2
RUNS=$3
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d /tmp/k3_constrain_prop.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
/usr/bin/python3 -c "import jsonschema" || { echo "FAIL: python3-jsonschema is missing (scripts/install-deps.sh)"; exit 1; }
nschemas=$(/usr/bin/python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))))" "$HERE/schemas.json")
# Compact JSON (response_format, json blocks) RUNS times per schema, and once in
# the spelling of XTML tool arguments (Python json.dumps separators).
for mode in compact python; do
  runs=$RUNS
  [ "$mode" = python ] && runs=1
  set +e
  "$DRIVE" "$MODEL" "$HERE/schemas.json" "$runs" 16 "$mode" > "$WORK/out-$mode.jsonl"
  rc=$?
  set -e
  # The checker reports generator failures (rc != 0) line by line too.
  /usr/bin/python3 "$HERE/check_outputs.py" "$HERE/schemas.json" "$WORK/out-$mode.jsonl" $((nschemas * runs)) "$mode"
  if [ "$rc" -ne 0 ]; then echo "FAIL: constrain_drive ($mode) exited $rc"; exit 1; fi
done
echo "property_test: OK"

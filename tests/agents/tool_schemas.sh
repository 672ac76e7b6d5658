#!/usr/bin/env bash
# The tool schemas the pinned agent CLIs send (captured from their first
# requests by capture_tools.py) through the schema corpus test: each accepted
# non-strict, constrained answers valid, the relaxation a superset.
# usage: tool_schemas.sh CONSTRAIN_DRIVE MODEL_DIR OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
modules=$("$here/npm-install.sh")
mkdir -p "$3"
/usr/bin/python3 "$here/capture_tools.py" "$modules" > "$3/captured.json"
exec /usr/bin/python3 "$here/../constrain/corpus_test.py" "$1" "$2" 3 "$3/captured.json"

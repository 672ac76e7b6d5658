#!/usr/bin/env bash
# Installs the pinned agent CLIs once (npm-install.sh), then runs
# agents_test.py K3_SCRIPT_SERVE MODEL_DIR NODE_MODULES.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
modules=$("$here/npm-install.sh")
exec /usr/bin/python3 "$here/agents_test.py" "$1" "$2" "$modules"

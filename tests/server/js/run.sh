#!/usr/bin/env bash
# Runs one npm-client test: installs the pinned packages (npm-install.sh), then
# node TEST NODE_MODULES ARGS...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
test=$1; shift
modules=$("$here/npm-install.sh")
exec node "$here/$test" "$modules" "$@"

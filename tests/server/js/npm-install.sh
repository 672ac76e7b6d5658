#!/usr/bin/env bash
# Installs the pinned npm clients (package.json + package-lock.json beside this
# script) into a cache folder, once; prints the node_modules path. Needs the npm
# registry only the first time (or when the lock file changes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${K3_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/k3/npm-server}
mkdir -p "$cache"
if ! cmp -s "$here/package-lock.json" "$cache/package-lock.json" || [ ! -d "$cache/node_modules" ]; then
  cp "$here/package.json" "$here/package-lock.json" "$cache/"
  (cd "$cache" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
echo "$cache/node_modules"

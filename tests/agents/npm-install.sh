#!/usr/bin/env bash
# Installs the pinned agent CLIs (package.json + package-lock.json beside this
# script: Claude Code, Codex, Qwen Code; about 1 GB, native binaries included)
# into a cache folder once; prints the node_modules path. Needs the npm
# registry only the first time (or when the lock file changes).
#
# `npm install`, not `npm ci`: Qwen Code's optional per-platform clipboard
# packages are missing from any lock file npm 10 writes on Linux, which `npm
# ci` refuses; the lock still pins every package that is installed. The copy
# of the lock file the cache was made from decides when to install again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=${K3_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/k3/npm-agents}
key=$(sha256sum "$here/package-lock.json" | cut -c1-16)
cache=$base/$key
mkdir -p "$cache"
exec 9>"$base/$key.lock"
flock 9
if ! cmp -s "$here/package-lock.json" "$cache/installed-from.json" || [ ! -d "$cache/node_modules/.bin" ]; then
  cp "$here/package.json" "$here/package-lock.json" "$cache/"
  (cd "$cache" && npm install --no-audit --no-fund --loglevel=error >&2)
  cp "$here/package-lock.json" "$cache/installed-from.json"
fi
echo "$cache/node_modules"

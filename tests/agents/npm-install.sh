#!/usr/bin/env bash
# Installs the pinned agent CLIs (package.json + package-lock.json beside this
# script: Claude Code, Codex, Qwen Code) into a cache folder, once; prints the
# node_modules path. Needs the npm registry only the first time (or when the
# lock file changes). About 1 GB (Codex and Claude Code ship native binaries).
#
# The folder is named by the lock file's hash, so checkouts with different
# pins keep their own install; an flock serialises tests that install at once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=${K3_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/k3/npm-agents}
key=$(sha256sum "$here/package-lock.json" | cut -c1-16)
cache=$base/$key
mkdir -p "$cache"
exec 9>"$base/$key.lock"
flock 9
if ! cmp -s "$here/package-lock.json" "$cache/package-lock.json" || [ ! -d "$cache/node_modules" ]; then
  cp "$here/package.json" "$here/package-lock.json" "$cache/"
  (cd "$cache" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
echo "$cache/node_modules"

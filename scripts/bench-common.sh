# Sourced by the bench-*.sh scripts that need k3-bench and the npm `tiktoken`
# package (MIT licence; its data and its WASM encoder are the baselines):
#   . "$(dirname "$0")/bench-common.sh"; k3_bench_bin; k3_npm_tiktoken "$work"
# Sets root, build (BUILD_DIR, default build) and tiktoken_version.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
tiktoken_version="1.0.22"  # the version that produced the oracle ids

# Sets bench_bin to build/bin/k3-bench, or exits 2 saying how to get it.
k3_bench_bin() {
  bench_bin="$build/bin/k3-bench"
  [[ -x "$bench_bin" ]] || { echo "missing $bench_bin (build k3-bench, or set BUILD_DIR)" >&2; exit 2; }
}

# Installs tiktoken@$tiktoken_version under WORK (.cache/, git-ignored) unless
# that exact version is already there.
k3_npm_tiktoken() {
  local work="$1" pkg="$1/node_modules/tiktoken/package.json"
  mkdir -p "$work"
  if [[ ! -f "$pkg" ]] || ! grep -q "\"version\": \"$tiktoken_version\"" "$pkg"; then
    [[ -f "$work/package.json" ]] || echo '{"private": true}' > "$work/package.json"
    (cd "$work" && npm install --silent --no-audit --no-fund "tiktoken@$tiktoken_version" >&2)
  fi
}

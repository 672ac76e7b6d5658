#!/usr/bin/env bash
# Options come from one place: no library source under lib/ reads the
# environment (getenv, secure_getenv, or core's GetEnv* helpers) outside the
# files whose job it is: core's helpers themselves (lib/core/src/sys.cc) and the
# FromEnv units the programs call at start-up. Tests (*_test.cc) may set and
# read variables. Comments are ignored. Run by ctest (env_reads_check, unit).
#   scripts/check-env-reads.sh [ROOT]   check ROOT (default: this checkout)
#   scripts/check-env-reads.sh --self-test   prove the check fails on a planted read
set -euo pipefail

# The files allowed to read the environment (paths relative to ROOT).
ALLOWED=(
  lib/core/src/sys.cc           # GetEnv, GetEnvInt, ... (the one parser)
  lib/core/include/k3/core/sys.h  # their declarations
  lib/engine/src/options.cc     # EngineOptions::FromEnv
  lib/vulkan/src/tier.cc        # vulkan::TierOptions::FromEnv
  lib/toolenv/src/toolenv.cc    # toolenv::ToolEnv::FromEnv (K3_LOG, kernels, crash hook)
)

check() {
  local root=$1 bad=0 f rel hits
  while IFS= read -r -d '' f; do
    rel=${f#"$root"/}
    case $rel in *_test.cc) continue ;; esac
    local allowed=0 a
    for a in "${ALLOWED[@]}"; do [[ $rel == "$a" ]] && allowed=1; done
    ((allowed)) && continue
    # Drop // comments, then look for a call.
    hits=$(sed -e 's|//.*$||' "$f" | grep -nE '\b(secure_)?getenv[[:space:]]*\(|\bGetEnv(Int|Double|Bool|Choice)?[[:space:]]*\(' || true)
    if [[ -n $hits ]]; then
      while IFS= read -r h; do echo "$rel:$h" >&2; done <<<"$hits"
      bad=1
    fi
  done < <(find "$root/lib" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cpp' \) -print0)
  if ((bad)); then
    echo "check-env-reads: the lines above read the environment inside a library; read it in a" >&2
    echo "FromEnv unit (EngineOptions::FromEnv, k3::toolenv) and pass the value in (docs/environment.md)" >&2
    return 1
  fi
}

if [[ ${1:-} == --self-test ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/lib/quant/src" "$tmp/lib/core/src"
  printf '// getenv("K3_X") in a comment is fine\nint Ok() { return 1; }\n' >"$tmp/lib/quant/src/ok.cc"
  printf '#include <cstdlib>\nconst char* v = std::getenv("K3_X");\n' >"$tmp/lib/core/src/sys.cc"
  check "$tmp" || { echo "self-test: a clean tree was refused" >&2; exit 1; }
  for planted in 'std::getenv("K3_X")' 'GetEnvBool("K3_X", false)' 'GetEnv ("K3_X")' '::secure_getenv("HOME")'; do
    printf 'bool f() { return %s; }\n' "$planted" >"$tmp/lib/quant/src/bad.cc"
    if check "$tmp" 2>/dev/null; then
      echo "self-test: a planted read was not caught: $planted" >&2
      exit 1
    fi
  done
  echo "check-env-reads self-test: clean tree passes, 4 planted reads caught"
  exit 0
fi

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
check "$root"
echo "check-env-reads: no library reads the environment outside ${#ALLOWED[@]} allowed files"

#!/usr/bin/env bash
# One short run on a GPU machine (Debian 12 with the NVIDIA driver, or any
# Vulkan device; lavapipe works too, its numbers are CPU numbers): installs the
# packages (scripts/install-deps.sh), builds, runs the `vulkan` ctest label on
# the device Vulkan picks, then `k3-bench vulkan` and writes one markdown table
# to stdout (and to $OUT/gpu-check.md with the raw JSON lines beside it when
# $OUT is set):
#   - the device's copy bandwidth (vkCmdCopyBuffer, device-local to device-local),
#   - the tier's MXFP4 expert matmul GB/s and the dense shaders' GB/s per weight
#     format, each as a ratio of that bandwidth (goal >= 0.7),
#   - decode s/token on a fixture model: CPU only vs the tier (K3_VK=1) vs the
#     tier + the trunk (K3_VK=1 K3_VK_DENSE=all), measured in the same process.
# Usage: scripts/gpu-check.sh [--small]
#   --small  small shapes and the `small` fixture preset (lavapipe, a laptop);
#            default: K3's real shapes and `real-layer --layers 2 --experts 64`.
# Environment: K3_BUILD_DIR (default build), K3_JOBS, K3_GPU_CHECK_SKIP_DEPS=1
# (packages already there), K3_GPU_CHECK_FIXTURE (reuse a fixture directory),
# OUT. Exit status: non-zero when the build, a test or a benchmark failed.
set -euo pipefail
cd "$(dirname "$0")/.."

small=0
for a in "$@"; do
  case $a in
    --small) small=1 ;;
    -h | --help)
      sed -n '2,20p' "$0"
      exit 0
      ;;
    *)
      echo "gpu-check: unknown argument '$a' (try --help)" >&2
      exit 2
      ;;
  esac
done

BUILD_DIR=${K3_BUILD_DIR:-build}
work=$(mktemp -d "${TMPDIR:-/tmp}/k3-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
status=0

# The NVIDIA driver's Vulkan ICD may sit outside the loader's search path
# (containers that mount the driver under /usr/local/nvidia).
nv_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [[ -z ${VK_DRIVER_FILES:-} && -f $nv_icd ]] && ! ls /usr/share/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
  export VK_DRIVER_FILES=$nv_icd
  echo "gpu-check: VK_DRIVER_FILES=$nv_icd" >&2
fi

if [[ ${K3_GPU_CHECK_SKIP_DEPS:-0} != 1 ]]; then
  scripts/install-deps.sh >&2
fi
echo "gpu-check: building into $BUILD_DIR" >&2
scripts/build.sh >&2

echo "gpu-check: ctest -L vulkan" >&2
tests="passed"
if ! ctest --test-dir "$BUILD_DIR" -L vulkan --output-on-failure >"$work/ctest.txt" 2>&1; then
  tests="FAILED"
  status=1
fi
tail -n 25 "$work/ctest.txt" >&2
tests_line=$(grep -E 'tests passed|tests failed' "$work/ctest.txt" | tail -n 1 || true)

if ((small)); then
  shapes=(--moe-inter 256 --latent 256 --experts 4 --batches 1 8 --reps 3 --copy-mb 32
    --decode-tokens 4 --dense-bits 4 8 32)
  fixture_args=(--preset small --layers 2 --experts 8)
else
  shapes=(--experts 4 --batches 1 8 --reps 5 --copy-mb 512 --decode-tokens 8 --dense-bits 4 8)
  fixture_args=(--preset real-layer --layers 2 --experts 64)
fi
fixture=${K3_GPU_CHECK_FIXTURE:-}
if [[ -z $fixture ]]; then
  fixture=$work/fixture
  echo "gpu-check: k3-fixture ${fixture_args[*]}" >&2
  "$BUILD_DIR/bin/k3-fixture" "${fixture_args[@]}" --out "$fixture" --quiet >&2
fi

echo "gpu-check: k3-bench vulkan ${shapes[*]} --model $fixture" >&2
# The bench reads K3_VK_* like k3-run; a history file would warm-start later runs.
if ! XDG_CACHE_HOME=$work/cache K3_LOG=warn "$BUILD_DIR/bin/k3-bench" vulkan "${shapes[@]}" \
  --model "$fixture" >"$work/bench.jsonl"; then
  status=1
fi

python3 - "$work/bench.jsonl" "$tests" "$tests_line" "${fixture_args[*]}" >"$work/table.md" <<'EOF'
import json, sys
path, tests, tests_line, fixture = sys.argv[1:5]
lines = [json.loads(l) for l in open(path) if l.startswith("{")]
def first(what):
    return next((l for l in lines if l.get("what") == what), None)
copy = first("device_copy")
dev = copy["device"] if copy else "?"
kind = copy["type"] if copy else "?"
out = []
out.append(f"## k3 GPU check: {dev} ({kind})\n")
if kind == "cpu":
    out.append("Device is a CPU (lavapipe): the numbers are CPU numbers, not a GPU's.\n")
out.append(f"- `ctest -L vulkan`: **{tests}** ({tests_line.strip()})")
out.append(f"- git {lines[0]['git'] if lines else '?'}, CPU {lines[0]['cpu'] if lines else '?'}")
if copy:
    out.append(f"- device copy bandwidth (vkCmdCopyBuffer, read + write): **{copy['copy_gbps']:.1f} GB/s**\n")
out.append("| kernel | format | shape | batch | weight GB/s | / device copy | goal 0.7 | rel-L2 vs CPU |")
out.append("|---|---|---|---|---|---|---|---|")
for l in lines:
    if l.get("what") == "shader":
        r = l["ratio_vs_device_copy"]
        out.append(f"| tier expert (gate_up + down) | mxfp4 | {l['moe_inter']}x{l['latent']} x{l['experts']} | "
                   f"{l['batch']} | {l['weight_gbps']:.2f} | {r:.2f} | {'ok' if r >= 0.7 else 'below'} | "
                   f"{l['rel_l2_vs_cpu']:.1e} |")
for l in lines:
    if l.get("what") == "dense":
        r = l["ratio_vs_device_copy"]
        out.append(f"| trunk dense | {l['format']} | {l['rows']}x{l['cols']} | {l['batch']} | "
                   f"{l['weight_gbps']:.2f} | {r:.2f} | {'ok' if r >= 0.7 else 'below'} | "
                   f"{l['rel_l2_vs_cpu']:.1e} |")
d = first("decode")
out.append("")
if d:
    out.append(f"Decode on `k3-fixture {fixture}`, {d['tokens']} tokens, median of {d['reps']}:\n")
    out.append("| configuration | s/token | vs CPU |")
    out.append("|---|---|---|")
    out.append(f"| CPU only | {d['cpu_s_per_token']:.4f} | 1.00 |")
    out.append(f"| tier (K3_VK=1), {d['experts_resident']} experts resident | {d['tier_s_per_token']:.4f} | "
               f"{d['ratio_tier_vs_cpu']:.2f} |")
    if "tier_dense_s_per_token" in d:
        out.append(f"| tier + trunk (K3_VK_DENSE={d['dense_mode']}), {d['dense_matrices_on_device']} matrices, "
                   f"{d['dense_bytes_on_device'] / 1e9:.2f} GB | {d['tier_dense_s_per_token']:.4f} | "
                   f"{d['ratio_tier_dense_vs_cpu']:.2f} |")
    else:
        out.append("| tier + trunk | (not started: see the log) | |")
else:
    out.append("Decode: no result (see the log).")
print("\n".join(out))
EOF
cat "$work/table.md"
if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  cp "$work/table.md" "$OUT/gpu-check.md"
  cp "$work/bench.jsonl" "$OUT/gpu-check.jsonl"
  cp "$work/ctest.txt" "$OUT/gpu-check-ctest.txt"
fi
exit $status

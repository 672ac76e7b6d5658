#!/usr/bin/env python3
"""Markdown tables from `k3-bench kernels --json` lines (docs/PERFORMANCE.md).

    build/bin/k3-bench kernels --json --reps 5 --batch-ws-mib 48 > k.jsonl
    scripts/kernel-tables.py k.jsonl

Decode (batch 1): weight GB/s / ratio (plain read) [range over the passes] /
ratio_pf (prefetching read) (cpu_util) per ISA and thread count. Batch 32: GMAC/s / vs_sgemm for the IDOT
(MatMulQ8) and f32-activation (MatMul) paths.
"""
import json
import sys

ISAS = ["avx512", "avx2vnni", "avx2"]


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    threads = sorted({r["threads"] for r in rows})
    for m in rows:
        if m["kernel"] == "mem_read":
            print("mem_read t%d: %.2f GB/s plain, %.2f GB/s prefetching"
                  % (m["threads"], m["mem_read_gbps"], m.get("mem_read_pf_gbps", 0)))
    reads = {}
    for r in rows:  # the interleaved plain reads' range, per thread count
        if "mem_read_min_gbps" in r:
            lo, hi = reads.get(r["threads"], (1e9, 0))
            reads[r["threads"]] = (min(lo, r["mem_read_min_gbps"]), max(hi, r["mem_read_max_gbps"]))
    for t, (lo, hi) in sorted(reads.items()):
        print("interleaved plain reads t%d: %.2f-%.2f GB/s over the run" % (t, lo, hi))
    table = {}
    for r in rows:
        if r["kernel"] in ("mem_read", "sgemm_openblas"):
            continue
        path_name, fmt = r["kernel"].split("_", 1)
        key = (r["shape"], r["rows"], r["cols"], fmt)
        table.setdefault(key, {})[(path_name, r["batch"], r["threads"], r["isa"])] = r
    isas = [i for i in ISAS if any(k[3] == i for d in table.values() for k in d)]

    print("\n| matrix | format | path | "
          + " | ".join(f"{i} t{t}" for i in isas for t in threads) + " |")
    print("|" + "---|" * (3 + len(isas) * len(threads)))
    for (shape, nr, nc, fmt), d in table.items():
        for path_name, label in (("matmulq8", "IDOT"), ("matmul", "f32 acts")):
            cells = []
            for i in isas:
                for t in threads:
                    r = d.get((path_name, 1, t, i))
                    if r is None:
                        cells.append("—")
                    elif "ratio_min" in r:  # interleaved reads: median [range]
                        cells.append("%.2f / **%.2f** [%.2f–%.2f] / %.2f (%.2f)" % (
                            r["weight_gbps"], r["ratio"], r["ratio_min"], r["ratio_max"],
                            r.get("ratio_pf", 0), r["cpu_util"]))
                    else:
                        cells.append("%.2f / **%.2f** / %.2f (%.2f)" % (
                            r["weight_gbps"], r["ratio"], r.get("ratio_pf", 0), r["cpu_util"]))
            if any(c != "—" for c in cells):
                print(f"| {shape} {nr}×{nc} | {fmt} | {label} | " + " | ".join(cells) + " |")

    batches = sorted({k[1] for d in table.values() for k in d if k[1] > 1})
    for b in batches:
        print(f"\nbatch {b}: GMAC/s / vs_sgemm\n")
        print("| matrix | format | threads | sgemm GMAC/s | "
              + " | ".join(f"IDOT {i}" for i in isas) + " | "
              + " | ".join(f"f32 acts {i}" for i in isas) + " |")
        print("|" + "---|" * (4 + 2 * len(isas)))
        for (shape, nr, nc, fmt), d in table.items():
            for t in threads:
                sgemm, cells = None, []
                for path_name in ("matmulq8", "matmul"):
                    for i in isas:
                        r = d.get((path_name, b, t, i))
                        if r is not None and sgemm is None:
                            sgemm = r.get("sgemm_gmacs")
                        cells.append("—" if r is None else "%.1f / **%.2f×**" % (
                            r["gmacs"], r.get("vs_sgemm", 0)))
                if any(c != "—" for c in cells):
                    sg = "—" if sgemm is None else "%.1f" % sgemm
                    print(f"| {shape} {nr}×{nc} | {fmt} | {t} | {sg} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: kernel-tables.py K3_BENCH_KERNELS.jsonl")
    main(sys.argv[1])

"""k3-run --cluster on loopback (docs/cluster.md): tokens and logits
byte-identical to one host on the oracle model and other shapes, 2 and 3
ranks, symmetric or not, prefill windows and decode; checkpoints parked by a
lost cluster and resumed after the restart; start-up refusals naming the rank
and what differs; faults (SIGKILL mid-prefill and mid-decode, SIGSTOP, a
worker's disk error) reported within the deadline with the documented exit
codes; `serve --cluster` answering the in-flight request 503 when a worker dies.

usage: cluster_test.py K3_RUN K3_FIXTURE ORACLE_MODEL_DIR
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))
import serve_lib  # noqa: E402  (request helper, Check)

K3_RUN, K3_FIXTURE, ORACLE = sys.argv[1:4]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
          "--mca", "btl", "self,vader", "-x", "K3_LOG", "-x", "K3_CHUNK", "-x", "K3_EXPERT_GB",
          "-x", "OMP_NUM_THREADS"]
# 100 prompt ids: 4 prefill windows of 32 (K3_CHUNK), then decode.
IDS = ",".join(str((i * 37 + 11) % 2000 + 40) for i in range(100))
ENV = dict(os.environ, K3_LOG="warn", K3_CHUNK="32", OMP_NUM_THREADS="1")
check = serve_lib.Check()
tmp = tempfile.mkdtemp(prefix="k3-cluster-test-")


# Seconds from the start of the last run() to the first "injected fault" line
# on its stderr (None: no fault seen), so fault checks time what follows the fault.
last_fault_s = None


def run(cmd, env=None, timeout=240):
    global last_fault_s
    last_fault_s = None
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err_lines = []

    def read_err():
        global last_fault_s
        for line in p.stderr:
            if last_fault_s is None and b"injected fault" in line:
                last_fault_s = time.monotonic() - t0
            err_lines.append(line)

    reader = threading.Thread(target=read_err)
    reader.start()
    try:
        out = p.stdout.read()
        p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        reader.join()
    err = b"".join(err_lines)
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - t0


def generate(model, tag, ranks=0, extra=(), ngen=12, env=None, mpi_args=()):
    """k3-run generate, on one host (ranks=0) or under mpirun; returns (rc, json, logits bytes, stderr, s)."""
    logits = os.path.join(tmp, tag + ".logits")
    args = [K3_RUN, "generate", model, "--ids", IDS, "--ngen", str(ngen), "--json", "--threads", "1",
            "--ckpt-slots", "0", "--logits", logits, *extra]
    cmd = args if ranks == 0 else [*MPIRUN, *mpi_args, "-np", str(ranks), *args, "--cluster"]
    rc, out, err, s = run(cmd, env)
    j = None
    for line in out.splitlines():
        if line.startswith("{"):
            j = json.loads(line)
    data = open(logits, "rb").read() if rc == 0 and os.path.exists(logits) else b""
    return rc, j, data, err, s


def same_as_one_host(model, name, configs):
    rc, base, base_logits, err, _ = generate(model, name + "-1host")
    if not check(rc == 0 and base is not None, f"{name}: one host runs ({err[-400:]})"):
        return None
    for ranks, extra in configs:
        tag = f"{name}-{ranks}{'-sym' if '--cluster-symmetric' in extra else ''}"
        rc, j, logits, err, s = generate(model, tag, ranks, extra)
        ok = rc == 0 and j is not None
        check(ok, f"{tag}: runs (rc {rc}) {err[-600:]}")
        if not ok:
            continue
        check(j["generated_ids"] == base["generated_ids"], f"{tag}: tokens identical to one host")
        check(len(logits) > 0 and logits == base_logits, f"{tag}: prompt logits byte-identical to one host")
        c = j["stats"].get("cluster", {})
        owners = ranks if "--cluster-symmetric" in extra else ranks - 1
        check(len(c.get("workers", [])) == owners, f"{tag}: {owners} owner ranks in the stats")
        check(c.get("round_trips", 0) > 0 and c.get("bytes_sent", 0) > 0, f"{tag}: exchanges counted")
        serve_lib.log(f"{tag}: {s:.1f} s, {c.get('round_trips')} round trips, exchange {c.get('exchange_s', 0):.3f} s")
    return base


def fixture(name, *flags):
    d = os.path.join(tmp, name)
    rc, _, err, _ = run([K3_FIXTURE, "--preset", "tiny", "--out", d, *flags])
    assert rc == 0, err
    return d


# --- 1. identical to one host ------------------------------------------------------------
base = same_as_one_host(ORACLE, "oracle", [(2, ()), (3, ()), (2, ("--cluster-symmetric",)),
                                           (3, ("--cluster-symmetric", "--cluster-deadline", "30"))])
# IDOT off (f32 activations: the oracle's configuration) and the reduced mode's deviation.
env_f32 = dict(ENV, K3_IDOT="0")
rc, b32, l32, err, _ = generate(ORACLE, "f32-1host", env=env_f32)
rc2, c32, m32, err2, _ = generate(ORACLE, "f32-3", 3, env=env_f32, mpi_args=("-x", "K3_IDOT"))
check(rc == 0 and rc2 == 0 and l32 == m32 and b32["generated_ids"] == c32["generated_ids"],
      f"K3_IDOT=0, 3 ranks: identical ({err2[-400:]})")
rc, red, red_logits, err, _ = generate(ORACLE, "reduced-3", 3, ("--cluster-reduced",), env=env_f32,
                                       mpi_args=("-x", "K3_IDOT"))
if check(rc == 0 and len(red_logits) == len(l32), f"reduced mode runs ({err[-300:]})"):
    import struct
    a = struct.unpack(f"{len(l32) // 4}f", l32)
    b = struct.unpack(f"{len(red_logits) // 4}f", red_logits)
    num = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5
    den = sum(x * x for x in a) ** 0.5
    serve_lib.log(f"reduced (bf16 answers) vs bit-exact: prompt logits rel-L2 {num / den:.3g}")
    check(num / den < 5e-2, "reduced mode: logits within 5e-2 rel-L2")

# Other shapes: 5 layers x 24 experts; 3 layers x 7 experts without shared experts.
shape_a = fixture("shape-a", "--layers", "5", "--experts", "24")
base_a = same_as_one_host(shape_a, "5x24", [(3, ())])
# Capacities measured at start (auto): each owner rank logs what it measured, the
# coordinator the values that reproduce the placement in `k3-run cluster-share`.
rc, j, logits, err, _ = generate(shape_a, "5x24-auto", 3, ("--cluster-symmetric", "--cluster-ram-gb", "auto",
                                                         "--cluster-disk-gbps", "auto"), env=dict(ENV, K3_LOG="info"))
if check(rc == 0 and j is not None and base_a is not None, f"measured capacities: runs ({err[-600:]})"):
    check(j["generated_ids"] == base_a["generated_ids"] and
          logits == open(os.path.join(tmp, "5x24-1host.logits"), "rb").read(),
          "measured capacities: tokens and logits identical to one host")
    measured = sorted(set(re.findall(r"rank (\d+) measured its capacity: RAM \S+ (?:\S+ )?\(its expert cache\) "
                                     r"disk [0-9.e+-]+ GB/s", err)))
    check(measured == ["0", "1", "2"], f"every owner rank measured RAM and disk: {measured}")
    fp = re.search(r"placement ([0-9a-f]{16})", err)
    again = re.search(r"--ram-gb (\S+) --disk-gbps (\S+)", err)
    if check(fp is not None and again is not None, "the coordinator logs the placement and the measured values"):
        rc2, out2, err2, _ = run([K3_RUN, "cluster-share", shape_a, "--ranks", "3", "--symmetric",
                                  "--ram-gb", again.group(1), "--disk-gbps", again.group(2)])
        check(rc2 == 0 and f"placement {fp.group(1)}" in out2,
              f"cluster-share with the logged values gives the job's placement {fp.group(1)}: {out2[:200]} {err2[-200:]}")
shape_b = fixture("shape-b", "--layers", "3", "--experts", "7")
cfg_path = os.path.join(shape_b, "config.json")
cfg = json.load(open(cfg_path))
tc = cfg.get("text_config", cfg)
key = "n_shared_experts" if "n_shared_experts" in tc else "num_shared_experts"
tc[key] = 0
json.dump(cfg, open(cfg_path, "w"))
same_as_one_host(shape_b, "3x7-noshared", [(2, ()), (3, ("--cluster-symmetric",))])

# --- 2. refusals at start-up ----------------------------------------------------------------
def mpmd(parts, timeout=120):
    """mpirun with one app context per rank: [(model, extra args, env dict)]."""
    cmd = list(MPIRUN)
    for i, (model, extra, env) in enumerate(parts):
        if i:
            cmd.append(":")
        cmd += ["-np", "1"]
        for k, v in env.items():
            cmd += ["-x", f"{k}={v}"]
        cmd += [K3_RUN, "generate", model, "--ids", IDS, "--ngen", "2", "--threads", "1", "--ckpt-slots", "0",
                "--cluster", *extra]
    return run(cmd, timeout=timeout)


rc, _, err, _ = mpmd([(ORACLE, (), {}), (shape_a, (), {})])
check(rc == 7 and re.search(r"rank 1 \([^)]*\): different model", err) is not None,
      f"a different model on rank 1 is refused naming it (rc {rc}): {err[-500:]}")
rc, _, err, _ = mpmd([(ORACLE, (), {}), (ORACLE, ("--cluster-symmetric",), {})])
check(rc == 7 and "rank 1" in err and "different placement" in err,
      f"a different placement on rank 1 is refused naming it (rc {rc}): {err[-500:]}")
# Shares: rank 1 of 3 prepared, and used by rank 2 too: rank 2 lacks its bytes.
share1 = os.path.join(tmp, "share1")
rc, out, err, _ = run([K3_RUN, "cluster-share", ORACLE, "--ranks", "3", "--rank", "1", "--prepare", share1])
check(rc == 0, f"cluster-share --prepare ({err[-300:]})")
rc, out, err, _ = run([K3_RUN, "cluster-share", ORACLE, "--ranks", "3", "--rank", "2", "--check", share1])
check(rc == 3 and "lacks bytes it owns" in err, f"cluster-share --check finds rank 2's bytes missing ({err[-300:]})")
rc, _, err, _ = mpmd([(ORACLE, (), {}), (share1, (), {}), (share1, (), {})])
check(rc != 0 and "rank 2" in err and "lacks bytes it owns" in err,
      f"a worker without its share is refused at start (rc {rc}): {err[-500:]}")
# Each rank on its own share (K3_DIRS pointing at the shards): identical output.
share2 = os.path.join(tmp, "share2")
run([K3_RUN, "cluster-share", ORACLE, "--ranks", "3", "--rank", "2", "--prepare", share2])
cmd = list(MPIRUN) + ["-np", "1", K3_RUN, "generate", ORACLE, "--ids", IDS, "--ngen", "12", "--json", "--threads",
                      "1", "--ckpt-slots", "0", "--cluster"]
for share in (share1, share2):
    cmd += [":", "-np", "1", K3_RUN, "generate", share, "--ids", IDS, "--ngen", "12", "--json", "--threads", "1",
            "--ckpt-slots", "0", "--cluster"]
rc, out, err, _ = run(cmd)
j = next((json.loads(x) for x in out.splitlines() if x.startswith("{")), None)
check(rc == 0 and j is not None and base is not None and j["generated_ids"] == base["generated_ids"],
      f"workers on prepared shares: identical tokens (rc {rc}) {err[-300:]}")

# --- 3. faults ------------------------------------------------------------------------------
# 100 ids in windows of 32: 4 windows x 7 MoE layers = 28 exchanges of prefill
# per worker at most; exchange 10 is mid-prefill, 60 mid-decode.
def fault(spec, deadline, expect_rc, what, extra=(), env=None, mpi_args=()):
    rc, j, _, err, s = generate(ORACLE, "fault", 3, ("--cluster-fault", spec, "--cluster-deadline", str(deadline),
                                                     *extra), ngen=30, env=env, mpi_args=mpi_args)
    rank = spec.split(":")[0]
    named = re.search(rf"rank {rank}\b", err) is not None
    check(named, f"{what}: the coordinator names rank {rank}: {err[-600:]}")
    check(rc in expect_rc, f"{what}: exit {rc}, expected {expect_rc}")
    # The exchange in flight when the worker fails ends by its deadline at the
    # latest (docs/cluster.md "Faults"); then the coordinator exits and mpirun
    # tears the job down: 5 s for that on a loaded 2-core host.
    after = None if last_fault_s is None else s - last_fault_s
    check(after is not None and after < deadline + 5,
          f"{what}: over {after if after is None else round(after, 1)} s after the fault (deadline {deadline} s, "
          f"{s:.1f} s in all)")
    serve_lib.log(f"{what}: exit {rc} after {s:.1f} s, {after if after is None else round(after, 1)} s after the fault")
    return err


# SIGKILL: mpirun SIGTERMs the coordinator at once; it fails the exchange,
# parks, says exit 75; mpirun itself exits 137 (the killed rank's signal).
# Open MPI's SIGKILL follows its SIGTERM after odls_base_sigkill_timeout (1 s by
# default): on a loaded host that can cut the coordinator off before it says so
# (docs/cluster.md recommends 30 s for jobs), so these runs give it 5 s.
GRACE = ("--mca", "odls_base_sigkill_timeout", "5")
err = fault("1:kill@10", 20, (137, 75), "SIGKILL mid-prefill", mpi_args=GRACE)
check("exit 75" in err, "SIGKILL mid-prefill: the coordinator ends with exit 75")
err = fault("2:kill@60", 20, (137, 75), "SIGKILL mid-decode", mpi_args=GRACE)
check("exit 75" in err, "SIGKILL mid-decode: the coordinator ends with exit 75")
# SIGSTOP: nobody tells mpirun; the deadline does, and the job ends with 75.
err = fault("1:stop@60", 2, (75,), "SIGSTOP mid-decode")
check("did not answer" in err, "SIGSTOP: reported as late")
# A worker's disk error comes back typed (io, exit 10), naming the rank.
err = fault("2:disk@3", 20, (10,), "disk error", env=dict(ENV, K3_EXPERT_GB="0.000001"))
check("[io]" in err or "Input/output error" in err, f"disk error: typed io error: {err[-300:]}")

# Checkpoints across a cluster restart: the lost run parks, the rerun resumes.
ck = os.path.join(tmp, "ckpt")
ck_args = ("--ckpt-slots", "8", "--ckpt-dir", ck, "--ckpt-every", "32")
args = [K3_RUN, "generate", ORACLE, "--ids", IDS, "--ngen", "12", "--json", "--threads", "1", *ck_args, "--cluster"]
# mpirun SIGKILLs the survivors 1 s after its SIGTERM by default; parking on
# this shared 2-core machine can take longer, so the job grants it 30 s.
rc, out, err, _ = run([*MPIRUN, "--mca", "odls_base_sigkill_timeout", "30", "-np", "3", *args,
                       "--cluster-fault", "1:kill@60", "--cluster-deadline", "20"])
m = re.search(r"parked (\d+) checkpoints", err)
check(m is not None and int(m.group(1)) > 0, f"the lost run parked its checkpoints: {err[-400:]}")
rc, out, err, _ = run([*MPIRUN, "-np", "3", *args])
j = next((json.loads(x) for x in out.splitlines() if x.startswith("{")), None)
check(rc == 0 and j is not None and j["stats"]["cached_tokens"] > 0,
      f"the restarted cluster resumed from the parked checkpoints ({err[-300:]})")
check(j is not None and base is not None and j["generated_ids"] == base["generated_ids"],
      "the resumed run's tokens equal one host's")

# --- 4. serve --cluster: a dead worker's in-flight request gets 503 --------------------------
log_path = os.path.join(tmp, "serve.log")
logf = open(log_path, "wb")
proc = subprocess.Popen([*MPIRUN, "-np", "3", K3_RUN, "serve", ORACLE, "--host", "127.0.0.1", "--port", "0",
                         "--threads", "1", "--ckpt-slots", "0", "--cluster", "--cluster-deadline", "3",
                         "--cluster-fault", "1:stop@80"], stdout=logf, stderr=subprocess.STDOUT, env=ENV)
port = None
t_end = time.monotonic() + 120
while time.monotonic() < t_end and port is None and proc.poll() is None:
    mm = re.search(rb"listening on http://[0-9.]+:(\d+)", open(log_path, "rb").read())
    port = int(mm.group(1)) if mm else None
    time.sleep(0.1)
ready = False
while port and time.monotonic() < t_end and proc.poll() is None:
    st, _, _ = serve_lib.request(port, "GET", "/health")
    if st == 200:
        ready = True
        break
    time.sleep(0.1)
if check(ready, "serve --cluster became ready: " + open(log_path, "rb").read().decode(errors="replace")[-500:]):
    st, _, body = serve_lib.request(port, "GET", "/metrics")
    check(st == 200 and b"k3_cluster_placement_info" in body and b"k3_cluster_worker_owned_experts" in body,
          "/metrics shows the placement and per-worker counters")
    body = {"model": "k3", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}
    st, _, data = serve_lib.chat(port, body)
    # Its 204-token prompt is 7 windows of 32 over 8 layers: 57 work messages
    # for rank 1, so the fault at the 80th falls in the second request.
    check(st == 200 and "choices" in data, f"a first request is answered ({st} {str(data)[:200]})")
    body["max_tokens"] = 40
    st, _, data = serve_lib.chat(port, body)
    # A whole answer holds its status (--hold-status, 30 s): the in-flight request's
    # lost worker is its own 503 with the error object.
    err_obj = data.get("error", {}) if isinstance(data, dict) else {}
    check(st == 503 and err_obj.get("code") == "unavailable" and "rank 1" in err_obj.get("message", ""),
          f"the in-flight request gets the unavailable error naming rank 1: {st} {str(data)[:300]}")
try:
    rc = proc.wait(timeout=60)
except subprocess.TimeoutExpired:
    proc.kill()
    rc = proc.wait()
check(rc == 75, f"serve --cluster ends with exit 75 after a lost worker (got {rc})")

shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.done())

"""k3-run --cluster on loopback (docs/cluster.md): tokens and logits
byte-identical to one host on the oracle model and other shapes, 2 and 3
ranks, symmetric or not, prefill windows and decode; checkpoints parked by a
lost cluster and resumed after the restart; start-up refusals naming the rank
and what differs; faults (SIGKILL mid-prefill and mid-decode, SIGSTOP, a
worker's disk error) reported within the deadline with the documented exit
codes; `serve --cluster` answering the in-flight request 503 when a worker dies;
`serve --cluster --parallel`: concurrent requests stepped together over the
ranks equal one host's alone answers, and a lost worker fails every running
request with its own 503.

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


def start_serve(cmd, name):
    """Starts a server (under mpirun or not); returns (process, port or None when it never became ready, log)."""
    log_path = os.path.join(tmp, name + ".log")
    proc = subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=ENV)
    port = None
    t_end = time.monotonic() + 120
    while time.monotonic() < t_end and port is None and proc.poll() is None:
        mm = re.search(rb"listening on http://[0-9.]+:(\d+)", open(log_path, "rb").read())
        port = int(mm.group(1)) if mm else None
        time.sleep(0.1)
    while port and time.monotonic() < t_end and proc.poll() is None:
        st, _, _ = serve_lib.request(port, "GET", "/health")
        if st == 200:
            return proc, port, log_path
        time.sleep(0.1)
    return proc, None, log_path


def read_log(path):
    return open(path, "rb").read().decode(errors="replace")


SERVE = [K3_RUN, "serve", ORACLE, "--host", "127.0.0.1", "--port", "0", "--threads", "1", "--ckpt-slots", "0"]
proc, port, log_path = start_serve([*MPIRUN, "-np", "3", *SERVE, "--cluster", "--cluster-deadline", "3",
                                    "--cluster-fault", "1:stop@80", "--parallel", "1"], "serve")
if check(port is not None, "serve --cluster became ready: " + read_log(log_path)[-500:]):
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

# --- 5. serve --cluster --parallel 3: requests stepped together over the ranks -----------------
# Mixed requests sent at once in a shuffled order, beside a client that leaves
# mid-answer, get byte for byte what each gets alone on one host; the steps
# held several sequences (each step's expert batch went through the cluster's
# executor); then a worker is lost while two requests run in one step: each
# gets its own 503 and the server exits 75 (the cluster's fail-stop).
REQS = [
    {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 14, "seed": 1},
    {"messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(90))}], "max_tokens": 6, "seed": 2},
    {"messages": [{"role": "user", "content": "tell me a story"}], "max_tokens": 20, "seed": 3,
     "thinking": {"type": "disabled"}},
    {"messages": [{"role": "user", "content": "stream it"}], "max_tokens": 12, "seed": 4, "stream": True},
    {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 16, "temperature": 0},
]
for r in REQS:
    r["model"] = "k3"


def answer(res):
    st, _, j = res
    if st != 200:
        return (st, str(j)[:200])
    if isinstance(j, list):
        m = serve_lib.accumulate(j)
        return (st, m["message"]["content"], m["message"]["reasoning_content"], m["finish_reason"])
    msg = j["choices"][0]["message"]
    return (st, msg.get("content"), msg.get("reasoning_content"), j["choices"][0]["finish_reason"])


proc, port, log_path = start_serve([*SERVE, "--parallel", "1"], "serve-1host")
alone = None
if check(port is not None, "one host serves: " + read_log(log_path)[-500:]):
    alone = [answer(serve_lib.chat(port, r)) for r in REQS]
    check(all(a[0] == 200 for a in alone), f"each request answered alone on one host: {alone}")
proc.terminate()
proc.wait(timeout=60)

proc, port, log_path = start_serve([*MPIRUN, "-np", "3", *SERVE, "--cluster", "--parallel", "3",
                                    "--step-tokens", "24", "--queue", "8"], "serve-parallel")
if check(port is not None, "serve --cluster --parallel 3 became ready: " + read_log(log_path)[-500:]) and alone:
    import random
    order = list(range(len(REQS)))
    random.Random(5).shuffle(order)
    leaver = {"model": "k3", "messages": [{"role": "user", "content": "I will leave"}], "max_tokens": 100000,
              "seed": 11, "stream": True, "ignore_eos": True}
    fns = [lambda i=i: (i, serve_lib.chat(port, REQS[i])) for i in order]
    fns.insert(2, lambda: (-1, serve_lib.stream_until_first_token(port, leaver).close()))
    got = {i: answer(r) for i, r in serve_lib.run_threads(fns) if i >= 0}
    bad = [(i, got[i], alone[i]) for i in range(len(REQS)) if got[i] != alone[i]]
    check(not bad, f"--parallel 3 on the cluster: every answer equals one host's alone answer (differ: {bad})")
    st, _, metrics = serve_lib.request(port, "GET", "/metrics")
    m = re.search(rb"\nk3_step_max_sequences (\d+)", metrics)
    check(m is not None and int(m.group(1)) >= 2, f"steps held several sequences ({m and m.group(1)})")
    rt = re.search(rb'\nk3_cluster_round_trips_total (\d+)', metrics)
    check(rt is not None and int(rt.group(1)) > 0, "the steps' experts went through the cluster")
    # The leaver's sequence was cancelled; the server still answers.
    st, _, data = serve_lib.chat(port, REQS[0])
    check(answer((st, None, data)) == alone[0], "after the leaver, a request is still answered as alone")
proc.terminate()
try:
    proc.wait(timeout=60)
except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()

proc, port, log_path = start_serve([*MPIRUN, "-np", "3", *SERVE, "--cluster", "--parallel", "2",
                                    "--cluster-deadline", "3", "--cluster-fault", "1:stop@200"], "serve-lost")
if check(port is not None, "serve --cluster --parallel 2 became ready: " + read_log(log_path)[-500:]):
    long_req = {"model": "k3", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 400,
                "ignore_eos": True, "seed": 1}
    results = serve_lib.run_threads([lambda s=s: serve_lib.chat(port, dict(long_req, seed=s)) for s in (1, 2)])
    errs = [(st, (d or {}).get("error", {}) if isinstance(d, dict) else {}) for st, _, d in results]
    check(all(st == 503 and e.get("code") == "unavailable" and "rank 1" in e.get("message", "") for st, e in errs),
          f"both running requests get their own 503 naming rank 1: {errs}")
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    check(rc == 75, f"serve --cluster --parallel 2 ends with exit 75 after a lost worker (got {rc})")
else:
    proc.kill()

shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.done())

#!/usr/bin/env python3
"""Parked checkpoints under attack and under kill -9, against the
real `k3-run chat` binary on k3-tiny:

- kill -9 while parking, at several points of the write (crash points
  `ckpt-piece-written:N`, `ckpt-before-commit`, `before-rename`; K3_CRASH_AT):
  the killed process leaves a partial `*.k3ckpt.tmp.<pid>`; the next process on
  that directory removes it at start, says so in one line, and answers exactly
  as a run without checkpoints;
- a symbolic link planted at every temp name the next process will use
  (`<file>.tmp.<pid>`, the pid known once it started): it parks anyway and no
  link's target is touched;
- a FIFO, a directory and a damaged file in place of parked checkpoints: the
  next process neither blocks nor fails, removes the damaged file, leaves the
  rest, and answers as a run without checkpoints.

usage: ckpt_hostile_test.py K3_RUN MODEL_DIR
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile

K3_RUN, MODEL = sys.argv[1], sys.argv[2]
failed = []
count = 0
USAGE = re.compile(r"^\[usage\] prompt_tokens=(\d+) cached_tokens=(\d+) prefilled=(\d+) completion_tokens=(\d+)$")
M1 = "Tell me about mixture of experts routing in large models."
M2 = "And what are shared experts for?"
TIMEOUT = 180  # a request blocked in open() on a FIFO would hang here instead of forever


def check(cond: bool, what: str) -> None:
    global count
    count += 1
    if not cond:
        failed.append(what)
        print("FAIL:", what, flush=True)


def chat_args(*flags: str) -> list:
    return [K3_RUN, "chat", MODEL, "--max-tokens", "6", "--threads", "1", "--temp", "0", *flags]


def env(**extra: str) -> dict:
    return dict(os.environ, K3_LOG="warn", OMP_NUM_THREADS="1", **extra)


def answers(out: str) -> list:
    """The answer texts: stdout and stderr share one pipe; [usage] ends each."""
    turns, text = [], []
    for line in out.splitlines():
        if USAGE.match(line):
            turns.append("\n".join(text))
            text = []
        elif not line.startswith("[parked") and not line.startswith("k3-run") and "ckpt:" not in line:
            text.append(line)
    return turns


def run(lines: list, *flags: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(chat_args(*flags), input="\n".join(lines) + "\n", stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=env(**extra), text=True, errors="replace",
                          timeout=TIMEOUT)


def entries(d: str) -> list:
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def parked(d: str) -> list:
    return [f for f in entries(d) if f.endswith(".k3ckpt")]


def temps(d: str) -> list:
    return [f for f in entries(d) if ".k3ckpt.tmp." in f]


def test_kill_while_parking(tmp: str, ref: list) -> None:
    sizes = []
    for point in ("ckpt-piece-written:1", "ckpt-piece-written:2", "ckpt-piece-written:4", "ckpt-before-commit",
                  "before-rename"):
        d = os.path.join(tmp, "kill-" + point.replace(":", "-"))
        # Buffered writes at the piece points, so the partial files differ in
        # length (O_DIRECT keeps small pieces staged until the end).
        direct = "0" if point.startswith("ckpt-piece-written") else "1"
        p = run([M1], "--ckpt-slots", "4", "--ckpt-dir", d, K3_CRASH_AT=point, K3_DIRECT=direct)
        check(p.returncode == -signal.SIGKILL, f"{point}: killed while parking (exit {p.returncode})")
        left = temps(d)
        # (Its size depends on the point: O_DIRECT data still staged is not in it yet.)
        check(len(left) == 1, f"{point}: one partial temp file left behind: {entries(d)}")
        sizes.append(os.path.getsize(os.path.join(d, left[0])) if left else -1)
        q = run([M1, M2], "--ckpt-slots", "4", "--ckpt-dir", d)
        check(q.returncode == 0, f"{point}: the restart runs: {q.stdout[-800:]}")
        check(answers(q.stdout) == ref, f"{point}: and answers as a run without checkpoints")
        check(re.search(r"ckpt: .*removed 1 leftover temp file\(s\)", q.stdout) is not None,
              f"{point}: the restart says it removed the leftover: {q.stdout[-800:]}")
        check(temps(d) == [], f"{point}: no temp file remains: {entries(d)}")
    print(f"   partial temp files left by the kills: {sizes} bytes", flush=True)


def park_then_unlink(d: str) -> list:
    """Runs one turn that parks its checkpoints in d, removes the files and
    returns their names (the same conversation parks under the same names)."""
    run([M1], "--ckpt-slots", "4", "--ckpt-dir", d)
    names = parked(d)
    check(len(names) >= 1, f"a first run parks its checkpoints: {entries(d)}")
    for n in names:
        os.unlink(os.path.join(d, n))
    return names


def test_planted_links(tmp: str) -> None:
    d = os.path.join(tmp, "links")
    names = park_then_unlink(d)
    victims = os.path.join(tmp, "victims")
    os.makedirs(victims)
    p = subprocess.Popen(chat_args("--ckpt-slots", "4", "--ckpt-dir", d), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env(), text=True, errors="replace")
    # The same conversation parks under the same names: a link at each temp
    # name this process will use, each to a file of its own.
    targets = []
    for i, n in enumerate(names):
        target = os.path.join(victims, f"victim{i}")
        with open(target, "w") as f:
            f.write(f"precious {i}\n")
        os.symlink(target, os.path.join(d, f"{n}.tmp.{p.pid}"))
        targets.append((target, f"precious {i}\n"))
    out, _ = p.communicate(M1 + "\n", timeout=TIMEOUT)
    check(p.returncode == 0 and "[parked" in out, f"it parks despite the links: {out[-800:]}")
    untouched = sum(1 for t, c in targets if open(t, "rb").read() == c.encode())
    check(untouched == len(targets), f"{untouched} of {len(targets)} link targets untouched")
    regular = [n for n in names if stat.S_ISREG(os.lstat(os.path.join(d, n)).st_mode)]
    check(regular == names, f"the parked files are regular files of its own: {entries(d)}")


def test_hostile_entries(tmp: str, ref: list) -> None:
    d = os.path.join(tmp, "hostile")
    # Every parked file becomes a FIFO (the one the next turn would restore included).
    for n in park_then_unlink(d):
        os.mkfifo(os.path.join(d, n))
    os.mkdir(os.path.join(d, "dir.k3ckpt"))
    with open(os.path.join(d, "damaged.k3ckpt"), "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    q = run([M1, M2], "--ckpt-slots", "4", "--ckpt-dir", d)
    check(q.returncode == 0, f"FIFO, directory, damaged file: the process runs: {q.stdout[-800:]}")
    check(answers(q.stdout) == ref, "and answers as a run without checkpoints")
    check(not os.path.exists(os.path.join(d, "damaged.k3ckpt")), "the damaged file was removed")
    check(os.path.isdir(os.path.join(d, "dir.k3ckpt")), "the directory was left alone")
    check(re.search(r"removed 0 leftover temp file\(s\) and 1 damaged file\(s\)", q.stdout) is not None,
          f"one line says what the scan did: {q.stdout[-800:]}")


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="k3-ckpt-hostile-")
    try:
        r = run([M1, M2], "--ckpt-slots", "0")
        ref = answers(r.stdout)
        check(r.returncode == 0 and len(ref) == 2, f"reference run: {r.stdout[-800:]}")
        test_kill_while_parking(tmp, ref)
        test_planted_links(tmp)
        test_hostile_entries(tmp, ref)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{count - len(failed)}/{count} checks passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

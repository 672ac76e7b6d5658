#!/usr/bin/env python3
"""`k3-run chat` driven over a pipe: /retry, /edit and /undo restore a
checkpoint instead of prefilling the conversation again, and the answers are
those of a fresh run of the same conversation with checkpoints off:

- greedy: each answer equals the one a fresh `--ckpt-slots 0` process gives for
  the conversation as it stands after the command; the [usage] lines show the
  restore (cached_tokens: everything but the last id for /retry, at least the
  history before the edited message for /edit and after /undo);
- sampled (temperature 1, one seed): the whole session, commands included, with
  checkpoints on prints the same answers as with checkpoints off;
- /exit or the end of input parks the RAM checkpoints in --ckpt-dir, and a new
  process on that directory starts its first turn from them.

usage: chat_ckpt_test.py K3_RUN MODEL_DIR
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

K3_RUN, MODEL = sys.argv[1], sys.argv[2]
failed = []
count = 0


def check(cond: bool, what: str) -> None:
    global count
    count += 1
    if not cond:
        failed.append(what)
        print("FAIL:", what, flush=True)


USAGE = re.compile(r"^\[usage\] prompt_tokens=(\d+) cached_tokens=(\d+) prefilled=(\d+) completion_tokens=(\d+)$")


def run_chat(lines: list, *flags: str) -> tuple:
    """Runs chat over a pipe; returns (turns, raw). Each turn is (answer text,
    prompt_tokens, cached_tokens): stdout and stderr share one pipe, so the
    [usage] line on stderr ends each answer."""
    env = dict(os.environ, K3_LOG="warn", OMP_NUM_THREADS="1")
    p = subprocess.run([K3_RUN, "chat", MODEL, "--max-tokens", "8", "--threads", "1", *flags],
                       input="\n".join(lines) + "\n", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=env, text=True, errors="replace", timeout=600)
    if p.returncode != 0:
        raise AssertionError(f"chat exited with {p.returncode}: {p.stdout[-2000:]}")
    turns, text = [], []
    for line in p.stdout.splitlines():
        m = USAGE.match(line)
        if m:
            turns.append(("\n".join(text), int(m.group(1)), int(m.group(2))))
            text = []
        elif not line.startswith("[undone") and not line.startswith("[parked"):
            text.append(line)
    return turns, p.stdout


M1 = "Tell me about mixture of experts routing in large models."
M2 = "And what are shared experts for?"
M2B = "And how is the load balanced across experts?"
M3 = "What does the KDA layer keep between tokens?"


def test_greedy():
    greedy = ("--temp", "0")
    turns, raw = run_chat([M1, M2, "/retry", "/edit " + M2B, "/undo", M3], *greedy, "--ckpt-slots", "8")
    check(len(turns) == 5, f"five answers (M1, M2, /retry, /edit, M3 after /undo): {len(turns)}\n{raw[-1500:]}")
    if len(turns) != 5:
        return
    check("[undone" in raw, "/undo says what it dropped")
    ref12, _ = run_chat([M1, M2], *greedy, "--ckpt-slots", "0")
    ref1b, _ = run_chat([M1, M2B], *greedy, "--ckpt-slots", "0")
    ref13, _ = run_chat([M1, M3], *greedy, "--ckpt-slots", "0")
    (a1, p1, c1), (a2, p2, c2), (a3, p3, c3), (a4, p4, c4), (a5, p5, c5) = turns
    check(a1 == ref12[0][0] and a2 == ref12[1][0], "the first two answers equal a fresh run's")
    check(a3 == ref12[1][0], "/retry (greedy) answers as a fresh run of the same conversation")
    check(a4 == ref1b[1][0], "/edit answers as a fresh run of the edited conversation")
    check(a5 == ref13[1][0], "after /undo the next message answers as a fresh run without the dropped exchange")
    print(f"   prompts {p1} {p2} {p3} {p4} {p5}, cached {c1} {c2} {c3} {c4} {c5}", flush=True)
    check(p3 == p2 and c3 == p3 - 1, f"/retry restores all but the prompt's last id (cached {c3} of {p3})")
    # The history before the edited message is the first exchange: at least
    # the first prompt (but its last id, which the history renders anew) is restored.
    check(c4 >= p1 - 1 and c4 < p4, f"/edit restores the history before the message (cached {c4}, first prompt {p1})")
    check(c5 >= p1 - 1 and c5 < p5, f"after /undo the next message restores that history too (cached {c5})")
    # Checkpoints off: the same commands replay the conversation.
    _, raw_off = run_chat([M1, M2, "/retry"], *greedy, "--ckpt-slots", "0")
    off = [USAGE.match(l) for l in raw_off.splitlines() if USAGE.match(l)]
    check(len(off) == 3 and int(off[2].group(2)) == 0, "with --ckpt-slots 0 /retry prefills from the start")


def test_sampled():
    script = [M1, M2, "/retry", "/edit " + M2B, "/retry", "/undo", M3]
    flags = ("--temp", "1", "--seed", "11")
    on, raw_on = run_chat(script, *flags, "--ckpt-slots", "4")
    off, raw_off = run_chat(script, *flags, "--ckpt-slots", "0")
    check(len(on) == 6 and [t[0] for t in on] == [t[0] for t in off],
          "sampled session with /retry /edit /undo: checkpoints on and off print the same answers")
    check(sum(t[2] for t in on) > sum(t[2] for t in off), "and with checkpoints on more of the prompts was restored")
    check(len({t[0] for t in on[1:3]}) == 2, "a sampled /retry draws a new answer (the stream continues)")


def test_park(tmp: str):
    d = os.path.join(tmp, "park")
    _, raw = run_chat([M1], "--temp", "0", "--ckpt-slots", "4", "--ckpt-dir", d)
    files = [f for f in os.listdir(d) if f.endswith(".k3ckpt")] if os.path.isdir(d) else []
    check("[parked" in raw and len(files) >= 1, f"the end of input parks the checkpoints ({len(files)} files)")
    turns, _ = run_chat([M1, M2], "--temp", "0", "--ckpt-slots", "4", "--ckpt-dir", d)
    ref, _ = run_chat([M1, M2], "--temp", "0", "--ckpt-slots", "0")
    check(len(turns) == 2 and turns[0][2] == turns[0][1] - 1,
          f"a new process starts its first turn from the parked checkpoint (cached {turns[0][2] if turns else '-'})")
    check([t[0] for t in turns] == [t[0] for t in ref], "and answers as a run without checkpoints")
    _, raw = run_chat([M3, "/exit", "ignored after /exit"], "--temp", "0", "--ckpt-slots", "4", "--ckpt-dir", d)
    check("[parked" in raw and raw.count("[usage]") == 1, "/exit parks too, and ends the session")


def main():
    tmp = tempfile.mkdtemp(prefix="k3-chat-ckpt-")
    try:
        help_text = subprocess.run([K3_RUN, "chat", "--help"], stdout=subprocess.PIPE, text=True).stdout
        check(all(c in help_text for c in ("/retry", "/edit TEXT", "/undo", "/help")), "--help lists the commands")
        out, _ = run_chat(["/help"], "--ckpt-slots", "0")
        _, raw = run_chat(["/help", "/retry", "/undo"], "--ckpt-slots", "0")
        check("/edit TEXT" in raw and "[nothing to retry or edit yet]" in raw and "[nothing to undo]" in raw,
              "/help lists the commands; /retry and /undo before any exchange say so")
        test_greedy()
        test_sampled()
        test_park(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{count - len(failed)}/{count} checks passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

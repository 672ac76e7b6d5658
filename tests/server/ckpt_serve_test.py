#!/usr/bin/env python3
"""Recurrent-state checkpoints through `k3-run serve` (docs/checkpoints.md),
black-box on the tiny model:

1. three conversations (two agents with tool results, one chat) alternating
   through 2 RAM slots (evicted ones parked in --ckpt-dir): every follow-up
   prefills only its tail (`usage.prompt_tokens_details.cached_tokens` covers
   the previous prompt), /metrics counts the hits and disk loads, RAM stays
   within the 2 slots at every poll (also while requests run), and every answer
   equals that of a server with checkpoints off fed the same requests (same
   seeds): bit-identical behaviour, not only faster;
2. a client that leaves in the middle of a long prefill, once a K-token
   checkpoint was taken: the same request again restores it (cached_tokens
   >= K, a multiple of K) and answers as the checkpoint-less server does;
3. a clean shutdown (SIGTERM) parks the RAM checkpoints in --ckpt-dir: a new
   server on that directory answers the follow-up from them (cached_tokens > 0,
   a disk load) with the checkpoint-less server's answer.

Servers listen on free loopback ports and are stopped by PID.
usage: ckpt_serve_test.py K3_RUN MODEL_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Check, Server, chat, raw_socket, user  # noqa: E402

K3_RUN, MODEL = sys.argv[1], sys.argv[2]
check = Check()
# One compute thread everywhere: the machine is shared, and both servers of a
# comparison then run the same kernels in the same order.
# One sequence: the follow-ups restore from checkpoints (with --parallel N a
# free sequence that still holds the conversation would serve them directly).
COMMON = ("--model-id", "k3-tiny", "--threads", "1", "--queue", "4", "--parallel", "1")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def ask(srv: Server, messages: list, seed: int, max_tokens: int = 8, **extra) -> dict:
    b = {"model": "k3-tiny", "messages": messages, "max_tokens": max_tokens, "seed": seed}
    b.update(extra)
    s, _, j = chat(srv.port, b)
    if s != 200:
        raise AssertionError(f"request failed with {s}: {j}")
    return j


def answer(j: dict) -> tuple:
    m = j["choices"][0]["message"]
    return (m.get("content"), m.get("reasoning_content"), json.dumps(m.get("tool_calls")),
            j["choices"][0]["finish_reason"])


def cached(j: dict) -> int:
    return j["usage"]["prompt_tokens_details"]["cached_tokens"]


class SlotWatch:
    """Polls /metrics while requests run: the RAM checkpoints never exceed the slots."""

    def __init__(self, srv: Server, slots: int):
        self.srv, self.slots, self.worst, self.polls = srv, slots, 0, 0
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            self.worst = max(self.worst, self.srv.metric("k3_checkpoint_ram_checkpoints"))
            self.polls += 1
            time.sleep(0.01)

    def done(self):
        self.stop.set()
        self.t.join()


def conversation_step(kind: str, history: list, round_idx: int, reply) -> list:
    """The next request's messages: history + the model's last answer + a new turn."""
    msgs = list(history)
    if reply is not None:
        m = reply["choices"][0]["message"]
        if kind == "chat":
            msgs.append({"role": "assistant", "content": m.get("content") or "",
                         "reasoning_content": m.get("reasoning_content") or ""})
        else:
            # An agent's loop: the model's turn calls a tool, the tool answers.
            call_id = f"call_{kind}_{round_idx}"
            msgs.append({"role": "assistant", "content": m.get("content") or "",
                         "tool_calls": [{"id": call_id, "type": "function", "function": {
                             "name": "get_weather", "arguments": json.dumps({"city": f"city{round_idx}"})}}]})
            msgs.append({"role": "tool", "tool_call_id": call_id,
                         "content": json.dumps({"forecast": words(f"{kind}r{round_idx}w", 12)})})
            return msgs
    msgs.append({"role": "user", "content": words(f"{kind}q{round_idx}w", 12)})
    return msgs


def test_alternating(tmp: str):
    convs = {"agent1": [{"role": "system", "content": "You are agent one."}],
             "chat": [],
             "agent2": [{"role": "system", "content": "You are agent two, " + words("tools", 4)}]}
    extra = {"agent1": {"tools": [WEATHER], "thinking": {"type": "disabled"}},
             "chat": {},
             "agent2": {"tools": [WEATHER], "thinking": {"type": "disabled"}}}
    requests = []  # (kind, round, messages, extra, seed) in the order sent
    with Server(K3_RUN, MODEL, *COMMON, "--ckpt-slots", "2", "--ckpt-dir", os.path.join(tmp, "alt")) as on:
        check("checkpoints: 2 RAM slots" in on.read_log(), "serve prints the checkpoint configuration")
        watch = SlotWatch(on, 2)
        last_reply = {k: None for k in convs}
        last_prompt = {k: 0 for k in convs}
        total_cached = 0
        for r in range(3):
            for kind in convs:
                convs[kind] = conversation_step(kind, convs[kind], r, last_reply[kind])
                seed = 100 * r + len(requests) + 1
                j = ask(on, convs[kind], seed, **extra[kind])
                requests.append((kind, r, convs[kind], extra[kind], seed, answer(j)))
                c, p = cached(j), j["usage"]["prompt_tokens"]
                total_cached += c
                print(f"   {kind} round {r}: prompt {p}, cached {c}", flush=True)
                if r == 0:
                    check(c == 0, f"{kind} round 0: nothing to reuse (cached {c})")
                else:
                    # Tail-only: everything the previous prompt had but its last
                    # id (the checkpoint before it) came from a checkpoint.
                    check(c >= last_prompt[kind] - 1 and c < p,
                          f"{kind} round {r}: cached {c} of {p} covers the previous prompt ({last_prompt[kind]})")
                last_reply[kind], last_prompt[kind] = j, p
        watch.done()
        check(watch.polls > 0 and watch.worst <= 2, f"RAM checkpoints within 2 slots ({watch.worst} at worst)")
        hits = on.metric("k3_checkpoint_hits_total")
        check(hits >= 6, f"k3_checkpoint_hits_total counts the 6 follow-ups ({hits})")
        check(on.metric("k3_checkpoint_disk_loads_total") >= 6,
              "3 conversations through 2 slots: the follow-ups are loaded from parked files")
        check(on.metric("k3_checkpoint_parks_total") > 0 and on.metric("k3_checkpoint_disk_bytes") > 0,
              "evicted checkpoints are parked")
        check(on.metric("k3_checkpoint_ram_bytes") > 0, "k3_checkpoint_ram_bytes is reported")
        restored = on.metric("k3_checkpoint_restored_tokens_total")
        check(restored == on.metric("k3_cached_tokens_total") == total_cached,
              f"k3_checkpoint_restored_tokens_total {restored} == the cached_tokens reported ({total_cached})")
    with Server(K3_RUN, MODEL, *COMMON, "--ckpt-slots", "0") as off:
        for kind, r, msgs, ex, seed, got in requests:
            want = answer(ask(off, msgs, seed, **ex))
            check(got == want, f"{kind} round {r}: the answer equals the checkpoint-less server's")


def finished(srv: Server) -> float:
    return (srv.metric("k3_requests_completed_total") + srv.metric("k3_requests_cancelled_total"))


def test_cancel_in_prefill(tmp: str):
    K = 128
    # Windows of K tokens (K3_CHUNK): a checkpoint reaches the cache when its
    # window ends, so with one automatic window for the whole prompt none would
    # exist before the prefill is over (docs/engine.md).
    with Server(K3_RUN, MODEL, *COMMON, "--ckpt-slots", "4", "--ckpt-every", str(K),
                env={"K3_CHUNK": str(K)}) as on:
        # The server sees a client gone at its second heartbeat write after the
        # close (one per second): the prefill must outlast that. How fast it
        # runs depends on the machine's load, so a longer prompt is tried when
        # the prefill ended first (checked from the metrics, not assumed).
        for n_words in (400, 1200, 3600):
            msgs = user(words(f"long{n_words}w", n_words))  # ~3 tokens a word
            body = {"model": "k3-tiny", "messages": msgs, "max_tokens": 6, "seed": 7, "stream": True}
            saves0 = on.metric("k3_checkpoint_saves_total")
            cancelled0 = on.metric('k3_requests_cancelled_by_phase_total{phase="prefill"}')
            tokens0 = on.metric("k3_completion_tokens_total")
            done0 = finished(on)
            data = json.dumps(body).encode()
            s = raw_socket(on.port)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
            # Leave once the first K-token checkpoint of this prefill exists
            # (read from /metrics while the prefill runs).
            on.wait_metric("k3_checkpoint_saves_total", saves0 + 1, limit_s=300)
            s.close()
            deadline = time.monotonic() + 600
            while finished(on) < done0 + 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            if on.metric('k3_requests_cancelled_by_phase_total{phase="prefill"}') == cancelled0 + 1:
                break
            print(f"   the prefill of {n_words} words ended before the server saw the client leave; longer",
                  flush=True)
        check(on.metric('k3_requests_cancelled_by_phase_total{phase="prefill"}') == cancelled0 + 1,
              "a client leaving mid-prefill cancels it in prefill")
        check(on.metric("k3_completion_tokens_total") == tokens0, "cancelled in prefill: no token generated")
        check(on.metric("k3_checkpoint_saves_total") >= saves0 + 1, "the cut prefill left K-token checkpoints")
        # Another conversation in between, so that the session no longer holds
        # the cut prefill (prefix reuse would hide the checkpoint).
        ask(on, user("something else"), 1, max_tokens=2)
        j = ask(on, msgs, 7, max_tokens=6)
        c = cached(j)
        print(f"   resumed: prompt {j['usage']['prompt_tokens']}, cached {c}", flush=True)
        check(c >= K and c % K == 0 and c < j["usage"]["prompt_tokens"],
              f"the same request again resumes from a K-token checkpoint (cached {c}, K {K})")
        got = answer(j)
    with Server(K3_RUN, MODEL, *COMMON, "--ckpt-slots", "0") as off:
        check(answer(ask(off, msgs, 7, max_tokens=6)) == got, "the resumed answer equals the checkpoint-less one")


def test_park_at_exit(tmp: str):
    d = os.path.join(tmp, "park")
    first = user(words("park", 40))
    with Server(K3_RUN, MODEL, *COMMON, "--ckpt-slots", "4", "--ckpt-dir", d) as a:
        j1 = ask(a, first, 3)
        check(a.metric("k3_checkpoint_parks_total") == 0, "nothing parked while the slots suffice")
        log_a = a
    log_text = log_a.read_log()
    files = [f for f in os.listdir(d) if f.endswith(".k3ckpt")]
    check(len(files) >= 2 and "parked" in log_text,
          f"SIGTERM parks the RAM checkpoints ({len(files)} files; log: {log_text[-300:]!r})")
    follow = first + [{"role": "assistant", "content": j1["choices"][0]["message"].get("content") or "",
                       "reasoning_content": j1["choices"][0]["message"].get("reasoning_content") or ""},
                      {"role": "user", "content": words("again", 30)}]
    with Server(K3_RUN, MODEL, *COMMON, "--ckpt-slots", "4", "--ckpt-dir", d) as b:
        check("(" + str(len(files)) + " found)" in b.read_log(), "the restarted server finds the parked files")
        j2 = ask(b, follow, 4)
        c = cached(j2)
        print(f"   after the restart: prompt {j2['usage']['prompt_tokens']}, cached {c}", flush=True)
        check(c >= j1["usage"]["prompt_tokens"] - 1,
              f"after a restart the follow-up resumes from a parked checkpoint (cached {c})")
        check(b.metric("k3_checkpoint_disk_loads_total") >= 1, "k3_checkpoint_disk_loads_total counts it")
        got = answer(j2)
    # A disk cap too small for one checkpoint: nothing is parked, no file left.
    d2 = os.path.join(tmp, "tiny-cap")
    with Server(K3_RUN, MODEL, *COMMON, "--ckpt-slots", "4", "--ckpt-dir", d2, "--ckpt-disk-gb", "0.00001") as c2:
        ask(c2, first, 3)
    check(not [f for f in os.listdir(d2) if f.endswith(".k3ckpt")], "--ckpt-disk-gb bounds what is parked at exit")
    with Server(K3_RUN, MODEL, *COMMON, "--ckpt-slots", "0") as off:
        ask(off, first, 3)
        check(answer(ask(off, follow, 4)) == got, "the answer after the restart equals the checkpoint-less one")


def main():
    tmp = tempfile.mkdtemp(prefix="k3-ckpt-serve-")
    try:
        for t in (test_alternating, test_cancel_in_prefill, test_park_at_exit):
            t0 = time.monotonic()
            t(tmp)
            print(f"== {t.__name__}: {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.done()


if __name__ == "__main__":
    sys.exit(main())

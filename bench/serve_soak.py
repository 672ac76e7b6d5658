#!/usr/bin/env python3
"""Soak of `k3-run serve` (docs/PERFORMANCE.md, "Server"; not in CI): CLIENTS concurrent clients for
SECONDS mixing plain and streamed chat completions and Messages requests,
clients that leave after the first event, and slow readers. Reports requests
served, errors by kind, p50/p99 TTFT of the streamed ones, the server's RSS
over time, and whether every finished answer equals the same request sent
alone with the same seed (chat completions; the Messages API has no seed, so
its answers are only checked to parse). Prints one JSON line at the end.

usage: serve_soak.py K3_RUN MODEL_DIR [SECONDS=600] [CLIENTS=16] [QUEUE=2*CLIENTS]

QUEUE is the server's --queue. A client that leaves keeps its place until the
server's next heartbeat write to it fails (at most --heartbeat-ms, 1 s), so
with QUEUE = CLIENTS the leavers briefly fill the queue and some requests get
the queue-full answer (429 / 529); the default leaves room for them.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
from serve_lib import HOST, Server, parse_sse, request  # noqa: E402

K3_RUN, MODEL = sys.argv[1], sys.argv[2]
SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 600
CLIENTS = int(sys.argv[4]) if len(sys.argv) > 4 else 16
QUEUE = int(sys.argv[5]) if len(sys.argv) > 5 else 2 * CLIENTS
PROMPTS = [f"Tell me about topic number {i} in a few words." for i in range(12)]


def chat_body(i: int, stream: bool) -> dict:
    return {"model": "k3-tiny", "messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": 24,
            "seed": 1000 + i, "stream": stream, "thinking": {"type": "disabled"}}


def messages_body(i: int, stream: bool) -> dict:
    return {"model": "k3-tiny", "messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": 24,
            "stream": stream, "metadata": {}, "thinking": {"type": "disabled"}, "seed": 1000 + i}


def text_of_chat(status, data: bytes, stream: bool):
    if status != 200:
        return None
    if stream:
        out = ""
        for e in parse_sse(data):
            if e == "[DONE]":
                continue
            for ch in e.get("choices") or []:
                out += (ch.get("delta") or {}).get("content") or ""
        return out
    return json.loads(data)["choices"][0]["message"]["content"]


def text_of_messages(status, data: bytes, stream: bool):
    if status != 200:
        return None
    if stream:
        out = ""
        for block in data.decode().split("\n\n"):
            for line in block.split("\n"):  # not splitlines(): U+2028 may be in the text
                if line.startswith("data: "):
                    e = json.loads(line[6:])
                    if e.get("type") == "content_block_delta" and e["delta"].get("type") == "text_delta":
                        out += e["delta"]["text"]
        return out
    return "".join(b.get("text", "") for b in json.loads(data)["content"] if b["type"] == "text")


def raw_stream(port: int, path: str, body: dict, mode: str):
    """Streams with a raw socket: 'leave' closes after the first data event,
    'slow' reads 256 bytes every 50 ms. Returns (status, bytes, ttft_s)."""
    data = json.dumps(body).encode()
    s = socket.create_connection((HOST, port), timeout=120)
    t0 = time.monotonic()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    buf, ttft = b"", None
    try:
        while True:
            got = s.recv(256 if mode == "slow" else 65536)
            if not got:
                break
            buf += got
            if ttft is None and (b"data: {" in buf and (b'"content"' in buf or b"text_delta" in buf)):
                ttft = time.monotonic() - t0
                if mode == "leave":
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    break
            if mode == "slow":
                time.sleep(0.05)
    finally:
        s.close()
    head, _, rest = buf.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ")[1])
    except (IndexError, ValueError):
        status = -1
    # Undo the chunked framing.
    body_bytes, r = b"", rest
    while r:
        line, _, r = r.partition(b"\r\n")
        try:
            n = int(line.split(b";")[0], 16)
        except ValueError:
            break
        body_bytes += r[:n]
        r = r[n + 2:]
        if n == 0:
            break
    return status, body_bytes, ttft


def main() -> int:
    srv = Server(K3_RUN, MODEL, "--model-id", "k3-tiny", "--queue", str(QUEUE), "--ckpt-slots", "0")
    try:
        # References: each request alone, whole.
        ref_chat, ref_msg = {}, {}
        for i in range(len(PROMPTS)):
            st, _, d = request(srv.port, "POST", "/v1/chat/completions", chat_body(i, False))
            ref_chat[i] = text_of_chat(st, d, False)
            st, _, d = request(srv.port, "POST", "/v1/messages", messages_body(i, False))
            ref_msg[i] = text_of_messages(st, d, False)
        lock = threading.Lock()
        stats = {"served": 0, "left_on_purpose": 0, "mismatch": 0, "errors": {}, "ttft": [], "by_kind": {}}
        rss = []
        stop_at = time.monotonic() + SECONDS

        def client(seed: int):
            rnd = random.Random(seed)
            while time.monotonic() < stop_at:
                i = rnd.randrange(len(PROMPTS))
                kind = rnd.choice(["chat", "chat_stream", "messages", "messages_stream", "leave", "slow"])
                path = "/v1/messages" if kind.startswith("messages") or (kind in ("leave", "slow") and rnd.random() < 0.5) \
                    else "/v1/chat/completions"
                is_msg = path == "/v1/messages"
                stream = kind not in ("chat", "messages")
                body = (messages_body if is_msg else chat_body)(i, stream)
                try:
                    if stream:
                        st, data, ttft = raw_stream(srv.port, path, body, "leave" if kind == "leave" else
                                                    "slow" if kind == "slow" else "normal")
                    else:
                        st, _, data = request(srv.port, "POST", path, body, timeout=300)
                        ttft = None
                except OSError as e:
                    with lock:
                        stats["errors"][type(e).__name__] = stats["errors"].get(type(e).__name__, 0) + 1
                    continue
                with lock:
                    stats["by_kind"][kind] = stats["by_kind"].get(kind, 0) + 1
                    if kind == "leave":
                        stats["left_on_purpose"] += 1
                        continue
                    if st != 200:
                        stats["errors"][str(st)] = stats["errors"].get(str(st), 0) + 1
                        continue
                    if ttft is not None:
                        stats["ttft"].append(ttft)
                    text = (text_of_messages if is_msg else text_of_chat)(st, data, stream)
                    ref = (ref_msg if is_msg else ref_chat)[i]
                    stats["served"] += 1
                    if is_msg:
                        # Anthropic's API has no seed: a Messages answer samples
                        # afresh, so only its shape is checked.
                        if text is None:
                            stats["mismatch"] += 1
                        continue
                    if text != ref:
                        stats["mismatch"] += 1
                        key = "mismatch_" + kind + ("_messages" if is_msg else "")
                        stats["by_kind"][key] = stats["by_kind"].get(key, 0) + 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            rss.append((round(time.monotonic() - t0), srv.rss_kib()))
            time.sleep(10)
        for t in threads:
            t.join()
        ttft = sorted(stats["ttft"])

        def pct(p):
            return round(ttft[min(len(ttft) - 1, int(p * len(ttft)))], 3) if ttft else None

        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        out = {"bench": "serve_soak", "git": sha, "seconds": SECONDS, "clients": CLIENTS, "queue": QUEUE,
               "served": stats["served"], "left_on_purpose": stats["left_on_purpose"], "by_kind": stats["by_kind"],
               "errors": stats["errors"], "answers_differing_from_solo": stats["mismatch"],
               "ttft_p50_s": pct(0.5), "ttft_p99_s": pct(0.99), "rss_kib_over_time": rss,
               "metrics_http_total": srv.metric("k3_http_requests_total"),
               "metrics_cancelled": srv.metric("k3_http_requests_cancelled_total")}
        print(json.dumps(out), flush=True)
        # Any error fails the soak: a 5xx (529, Anthropic's queue full, included),
        # a queue-full 429 with room for every client, a dropped connection.
        failures = list(stats["errors"])
        return 0 if stats["mismatch"] == 0 and not failures else 1
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Abuse of `k3-run serve` (conventions 18: every request is hostile until
parsed): malformed and truncated JSON, wrong types, deep nesting, invalid
UTF-8, a 64 MiB body, 10,000 messages, garbage and oversized headers, slow
senders, clients vanishing mid-stream; the same bodies on the Anthropic
Messages route. After each, the server must answer a normal request, and its
RSS must stay bounded.

usage: abuse_test.py K3_RUN MODEL_DIR
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Check, Server, chat, raw_socket, request, run_threads, user  # noqa: E402

K3_RUN, MODEL = sys.argv[1], sys.argv[2]
check = Check()
NORMAL = {"model": "k3-tiny", "messages": user("hi"), "max_tokens": 3}
RSS_SLACK_KIB = 256 * 1024  # bounded: well under what the abuse would cost if it were kept


def post_raw(port: int, payload: bytes, content_type: str = "application/json") -> int:
    status, _, _ = request(port, "POST", "/v1/chat/completions", payload, {"Content-Type": content_type})
    return status


def still_serves(srv, after: str) -> None:
    s, _, j = chat(srv.port, NORMAL)
    check(s == 200 and isinstance(j["choices"][0]["message"]["content"], str), f"serves after {after}")
    check(srv.alive(), f"alive after {after}")


def send_all_ignoring_reset(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer 413 and close before the body is all sent


def read_status(sock: socket.socket) -> int:
    buf = b""
    try:
        while b"\r\n" not in buf:
            got = sock.recv(4096)
            if not got:
                break
            buf += got
    except (ConnectionResetError, socket.timeout):
        pass
    try:
        return int(buf.split(b" ")[1])
    except (IndexError, ValueError):
        return -1


def main() -> int:
    with Server(K3_RUN, MODEL, "--model-id", "k3-tiny", "--read-timeout", "2") as srv:
        still_serves(srv, "start")
        rss0 = srv.rss_kib()
        good = json.dumps(NORMAL).encode()
        cases = {
            "malformed JSON": b'{"messages": [{"role": "user", "content": "hi"},]}',
            "truncated JSON": good[: len(good) // 2],
            "empty body": b"",
            "JSON null": b"null",
            "wrong types": json.dumps({"messages": "hi", "max_tokens": [], "stream": 3}).encode(),
            "messages of numbers": json.dumps({"messages": [1, 2, 3]}).encode(),
            "deep nesting": b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}",
            "deep object nesting": b'{"a":' * 5000 + b"1" + b"}" * 5000,
            "invalid UTF-8": b'{"messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}',
            "overlong UTF-8": b'{"messages": [{"role": "user", "content": "\xc0\xaf"}]}',
            "NUL bytes": b'{"messages": [{"role": "user", "content": "a\x00b"}]}',
            "10,000 messages": json.dumps({"messages": user("x") * 10000, "max_tokens": 1}).encode(),
            "huge number": b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e999999}',
        }
        for name, payload in cases.items():
            s = post_raw(srv.port, payload)
            check(s == 400, f"{name}: 400, got {s}")
            still_serves(srv, name)

        # The same hostile bodies on the Messages route: 400 in Anthropic's error shape.
        normal_messages = {"model": "k3-tiny", "max_tokens": 3, "messages": user("hi")}
        messages_cases = dict(cases, **{
            "10,000 messages": json.dumps(dict(normal_messages, messages=user("x") * 10000)).encode(),
            "deep content blocks": json.dumps(dict(normal_messages, messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [[[[[]]]]]}]}])).encode(),
            "image in a tool_result": json.dumps(dict(normal_messages, messages=[
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                              "content": [{"type": "image", "source": {}}]}]}])).encode(),
        })
        for name, payload in messages_cases.items():
            st, _, body = request(srv.port, "POST", "/v1/messages", payload, {"Content-Type": "application/json"})
            try:
                err = json.loads(body)
                shaped = err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
            except (ValueError, KeyError, TypeError):
                shaped = False
            check(st == 400 and shaped, f"messages, {name}: 400 invalid_request_error, got {st} {body[:120]!r}")
        st, _, body = request(srv.port, "POST", "/v1/messages", normal_messages)
        check(st == 200 and json.loads(body)["type"] == "message", "serves a Messages request after its abuse")
        still_serves(srv, "the Messages abuse")

        # A 64 MiB body: refused with 413 (the cap is 16 MiB) without being buffered.
        sock = raw_socket(srv.port)
        size = 64 << 20
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(size).encode() + b"\r\n\r\n")
        send_all_ignoring_reset(sock, b'{"messages":"' + b"x" * (size - 16) + b'"}')
        status = read_status(sock)
        sock.close()
        check(status == 413, f"64 MiB body: 413, got {status}")
        still_serves(srv, "a 64 MiB body")

        # Garbage instead of HTTP, and headers past the server's cap.
        for name, data in {"garbage request line": b"\x16\x03\x01 hello\r\n\r\n",
                           "oversized header": b"GET /health HTTP/1.1\r\nX-A: " + b"a" * 100000 + b"\r\n\r\n"}.items():
            sock = raw_socket(srv.port)
            send_all_ignoring_reset(sock, data)
            st = read_status(sock)
            sock.close()
            check(st in (-1, 400, 413, 414, 431), f"{name}: refused ({st})")
            still_serves(srv, name)

        # Slow senders hold no model time: 4 of them trickle bytes while a normal
        # request is answered; each is then dropped by the read timeout.
        slow = []
        for _ in range(4):
            sock = raw_socket(srv.port)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n{")
            slow.append(sock)
        s, _, _ = chat(srv.port, NORMAL)
        check(s == 200, "a normal request is answered while slow senders trickle")
        # Then they stall: the read timeout (2 s here) drops each one.
        dropped = 0
        for sock in slow:
            sock.settimeout(60)
            try:
                got = sock.recv(4096)
                while got and b"\r\n\r\n" not in got:
                    got += sock.recv(4096)
                dropped += 1  # closed, or answered with an error and closed
            except socket.timeout:
                pass  # still held open: a failure
            except OSError:
                dropped += 1  # reset
            sock.close()
        check(dropped == 4, f"slow senders are dropped ({dropped}/4)")
        still_serves(srv, "slow senders")

        # Clients vanishing mid-stream, several at once.
        before = srv.metric("k3_requests_cancelled_total")

        def vanish(path: bytes = b"/v1/chat/completions",
                   body: dict = dict(NORMAL, max_tokens=64, stream=True, thinking={"type": "disabled"})):
            sock = raw_socket(srv.port)
            data = json.dumps(body).encode()
            sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " +
                         str(len(data)).encode() + b"\r\n\r\n" + data)
            sock.recv(200)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()  # RST
        run_threads([vanish for _ in range(8)])
        srv.wait_metric("k3_requests_cancelled_total", before + 1)
        still_serves(srv, "clients vanishing mid-stream")

        # And mid-stream on the Messages route.
        before = srv.metric("k3_requests_cancelled_total")

        messages_stream = {"model": "k3-tiny", "max_tokens": 64, "stream": True, "messages": user("hi")}
        run_threads([lambda: vanish(b"/v1/messages", messages_stream) for _ in range(4)])
        srv.wait_metric("k3_requests_cancelled_total", before + 1)
        still_serves(srv, "Messages clients vanishing mid-stream")

        rss1 = srv.rss_kib()
        check(rss1 < rss0 + RSS_SLACK_KIB, f"RSS bounded: {rss0} KiB -> {rss1} KiB")
        print(f"rss: {rss0} KiB before abuse, {rss1} KiB after", flush=True)
    return check.done()


if __name__ == "__main__":
    sys.exit(main())

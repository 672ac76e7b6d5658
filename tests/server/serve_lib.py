"""Helpers for the black-box tests of `k3-run serve`: start the real server on
a free loopback port, talk HTTP / SSE to it with the standard library only, and
stop it by PID. Used by serve_test.py, abuse_test.py and the bench."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"


class Server:
    """One `k3-run serve` process; `port` is read from its "listening on" line."""

    def __init__(self, k3_run: str, model: str, *args: str, env: dict | None = None, log: str | None = None):
        self.cmd = [k3_run, "serve", model, "--host", HOST, "--port", "0", *args]
        full_env = dict(os.environ)
        full_env.setdefault("K3_LOG", "warn")
        if env:
            full_env.update(env)
        self.log_path = log or f"/tmp/k3-serve-test-{os.getpid()}-{id(self)}.log"
        self.log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        self.port = self._wait_port()
        self.wait_ready()

    def _wait_port(self, limit_s: float = 120) -> int:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.read_log()}")
            m = re.search(rb"listening on http://[0-9.]+:(\d+)", open(self.log_path, "rb").read())
            if m:
                return int(m.group(1))
            time.sleep(0.05)
        raise RuntimeError("server did not print its port: " + self.read_log())

    def wait_ready(self, limit_s: float = 300) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            status, _, _ = request(self.port, "GET", "/health")
            if status == 200:
                return
            if self.proc.poll() is not None:
                raise RuntimeError("server exited while loading: " + self.read_log())
            time.sleep(0.05)
        raise RuntimeError("server never became ready")

    def read_log(self) -> str:
        return open(self.log_path, "rb").read().decode("utf-8", "replace")[-4000:]

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metric(self, name: str) -> float:
        _, _, body = request(self.port, "GET", "/metrics")
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def wait_metric(self, name: str, at_least: float, limit_s: float = 60) -> float:
        """Waits for a condition (not a timing assertion): the counter reaching a value."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            v = self.metric(name)
            if v >= at_least:
                return v
            time.sleep(0.02)
        raise AssertionError(f"{name} stayed below {at_least} (now {self.metric(name)})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def request(port: int, method: str, path: str, body=None, headers: dict | None = None, timeout: float = 300):
    """(status, headers, body bytes); body may be dict (sent as JSON), str or bytes."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    h = dict(headers or {})
    if isinstance(body, dict):
        body = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    try:
        conn.request(method, path, body=body, headers=h)
        res = conn.getresponse()
        data = res.read()
        return res.status, {k.lower(): v for k, v in res.getheaders()}, data
    except (ConnectionError, OSError):
        return -1, {}, b""
    finally:
        conn.close()


def chat(port: int, body: dict, headers: dict | None = None):
    """POST /v1/chat/completions; returns (status, headers, parsed JSON or SSE events)."""
    status, h, data = request(port, "POST", "/v1/chat/completions", body, headers)
    if status == 200 and body.get("stream"):
        return status, h, parse_sse(data)
    try:
        return status, h, json.loads(data) if data else None
    except ValueError:
        return status, h, data


def parse_sse(data: bytes) -> list:
    """SSE bytes -> list of parsed data payloads ("[DONE]" kept as the string)."""
    events = []
    for block in data.decode("utf-8").split("\n\n"):
        if not block or block.startswith(":"):
            continue
        assert block.startswith("data: "), block[:80]
        payload = block[6:]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def accumulate(events: list) -> dict:
    """Rebuilds a non-streamed response from chunks, as the OpenAI SDK / KVV do."""
    msg = {"role": None, "content": "", "reasoning_content": "", "tool_calls": {}}
    finish, usage = None, None
    for e in events:
        if e == "[DONE]":
            continue
        if e.get("usage"):
            usage = e["usage"]
        for ch in e.get("choices") or []:
            d = ch.get("delta") or {}
            if d.get("role"):
                msg["role"] = d["role"]
            msg["content"] += d.get("content") or ""
            msg["reasoning_content"] += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                slot = msg["tool_calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["name"] = fn["name"]
                slot["arguments"] += fn.get("arguments") or ""
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    return {"message": msg, "finish_reason": finish, "usage": usage}


def user(text: str) -> list:
    return [{"role": "user", "content": text}]


class Check:
    """Collects named checks; a failing check is reported, not fatal, so one run lists all."""

    def __init__(self):
        self.failed = []
        self.count = 0

    def __call__(self, cond: bool, what: str) -> bool:
        self.count += 1
        if not cond:
            self.failed.append(what)
            print("FAIL:", what, flush=True)
        return cond

    def done(self) -> int:
        print(f"{self.count - len(self.failed)}/{self.count} checks passed", flush=True)
        return 1 if self.failed else 0


def raw_socket(port: int) -> socket.socket:
    s = socket.create_connection((HOST, port), timeout=30)
    return s


def stream_until_first_token(port: int, b: dict) -> socket.socket:
    """Sends a streamed chat request and reads until the first generated text; the socket stays open."""
    s = raw_socket(port)
    data = json.dumps(b).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    # The role chunk goes out before the queue wait and prefill progress may
    # follow: decode has begun only once a delta carries generated text.
    buf = b""
    while not re.search(rb'"(content|reasoning_content)":"[^"]', buf):
        got = s.recv(65536)
        if not got:
            break
        buf += got
    return s


def run_threads(fns) -> list:
    results = [None] * len(fns)

    def wrap(i, f):
        results[i] = f()

    threads = [threading.Thread(target=wrap, args=(i, f)) for i, f in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def run_timed(cases, *args) -> None:
    """Runs each case with `args`, printing how long it took."""
    for case in cases:
        t0 = time.monotonic()
        case(*args)
        print(f"{case.__name__}: {time.monotonic() - t0:.1f} s", flush=True)

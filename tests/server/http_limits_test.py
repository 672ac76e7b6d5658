#!/usr/bin/env python3
"""What the HTTP layer promises at its limits, seen from the client side, black
box against `k3-run serve` on the tiny model (docs/server.md "The HTTP layer"):

- lingering close: a body over --max-body-mb that the client sends whole
  before it reads (Python's http.client, Node's fetch) still gets its 413;
- the deadlines fire: the 408 head deadline, the idle keep-alive timeout and
  the write deadline, each set to a second so the test is quick;
- the connection cap: the 503 for a connection past it parses, and the
  longest-idle connections give way;
- start-up: SIGTERM / SIGINT stop the server within a second while the model
  loads (K3_STALL_AT holds the load);
- the web page cannot be framed.

usage: http_limits_test.py K3_RUN MODEL_DIR
"""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import HOST, Check, Server, raw_socket, request, run_timed  # noqa: E402

K3_RUN, MODEL = sys.argv[1], sys.argv[2]
check = Check()
MIB = 1 << 20
# Seconds of slack on a deadline: a loaded 2-core CI machine, the loop's 200 ms
# tick and the client's own polling.
SLACK_S = 1.5


def read_response(sock: socket.socket, limit_s: float = 10) -> tuple[int, dict, bytes]:
    """One whole Content-Length response, or (-1, {}, b"") when the connection
    ends before it is whole (so a wrong Content-Length fails)."""
    sock.settimeout(limit_s)
    buf = b""
    try:
        while b"\r\n\r\n" not in buf:
            got = sock.recv(65536)
            if not got:
                return -1, {}, b""
            buf += got
        head, rest = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        n = int(headers["content-length"])
        while len(rest) < n:
            got = sock.recv(65536)
            if not got:
                return -1, headers, rest
            rest += got
        return int(lines[0].split(" ")[1]), headers, rest[:n]
    except (OSError, ValueError, KeyError, IndexError):
        return -1, {}, b""


def closed_within(sock: socket.socket, limit_s: float) -> float | None:
    """Seconds until the server ends the connection (EOF or reset), reading and
    dropping what comes; None if it is still open after limit_s."""
    t0 = time.monotonic()
    sock.settimeout(0.1)
    while time.monotonic() - t0 < limit_s:
        try:
            if not sock.recv(65536):
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


# ---------------------------------------------------------------------------
# Lingering close

def python_post(port: int, size: int) -> tuple[int, str]:
    """http.client sends the whole body before it reads: (status, body or error)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", body=b"x" * size, headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        return res.status, res.read().decode("utf-8", "replace")
    except OSError as e:
        return -1, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


NODE_POST = r"""
const [url, size] = [process.argv[1], Number(process.argv[2])];
try {
  const r = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json"},
                              body: Buffer.alloc(size, 120)});
  console.log(JSON.stringify({status: r.status, body: await r.text()}));
} catch (e) {
  console.log(JSON.stringify({status: -1, body: String(e) + " " + String(e.cause && (e.cause.code || e.cause))}));
}
"""


def node_post(port: int, size: int) -> tuple[int, str]:
    """Node's fetch (undici, what the OpenAI and Anthropic SDKs use): (status, body or error)."""
    p = subprocess.run(["node", "--input-type=module", "-e", NODE_POST, f"http://{HOST}:{port}/v1/chat/completions",
                        str(size)], capture_output=True, text=True, timeout=120)
    try:
        j = json.loads(p.stdout.strip().splitlines()[-1])
        return j["status"], j["body"]
    except (ValueError, IndexError, KeyError):
        return -1, p.stdout + p.stderr


def test_lingering_close() -> None:
    with Server(K3_RUN, MODEL, "--model-id", "k3-tiny", "--max-body-mb", "16") as srv:
        clients = [("Python http.client", python_post)]
        if shutil.which("node"):
            clients.append(("Node fetch", node_post))
        else:
            check(os.environ.get("CI") != "true", "node is installed (CI)")
            print("SKIP Node fetch: no node on PATH", flush=True)
        for mib in (17, 64):
            for name, post in clients:
                t0 = time.monotonic()
                status, body = post(srv.port, mib * MIB)
                dt = time.monotonic() - t0
                check(status == 413 and "too large" in body,
                      f"{name}, {mib} MiB body against --max-body-mb 16: 413 readable after sending it all, "
                      f"got {status} {body[:160]!r} in {dt:.1f} s")
        # Bounded: a client that keeps sending past the body it announced is cut off.
        s = raw_socket(srv.port)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (17 * MIB))
        sent = 0
        chunk = b"y" * MIB
        try:
            while sent < 256 * MIB:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        s.close()
        check(sent < 64 * MIB, f"a client sending far past its announced 17 MiB is cut off ({sent // MIB} MiB sent)")
        st, _, _ = request(srv.port, "GET", "/health", timeout=10)
        check(st == 200 and srv.alive(), f"the server serves on after the lingering closes ({st})")


# ---------------------------------------------------------------------------
# Deadlines

def test_deadlines() -> None:
    with Server(K3_RUN, MODEL, "--model-id", "k3-tiny", "--head-timeout", "1", "--idle-timeout", "1",
                "--write-timeout", "1", "--read-timeout", "1") as srv:
        # The head deadline: a head trickled a byte per 100 ms never ends; 408 after 1 s.
        s = raw_socket(srv.port)
        t0 = time.monotonic()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        s.setblocking(False)
        answered = b""
        while time.monotonic() - t0 < 1 + SLACK_S + 2:
            r, _, _ = select.select([s], [], [], 0.1)
            if r:
                try:
                    got = s.recv(65536)
                except OSError:
                    break
                if not got:
                    break
                answered += got
                if b"\r\n\r\n" in answered:
                    break
            try:
                s.send(b"a")
            except OSError:
                break
        dt = time.monotonic() - t0
        s.close()
        check(answered.startswith(b"HTTP/1.1 408 ") and 0.9 <= dt <= 1 + SLACK_S,
              f"--head-timeout 1: a trickled head gets 408 after {dt:.2f} s ({answered[:30]!r})")

        # The idle keep-alive timeout: open after a request, closed 1 s later.
        s = raw_socket(srv.port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        st, h, _ = read_response(s)
        check(st == 200 and h.get("connection") == "keep-alive", f"a kept-alive /health ({st})")
        dt = closed_within(s, 1 + SLACK_S + 3)
        s.close()
        check(dt is not None and 0.8 <= dt <= 1 + SLACK_S,
              f"--idle-timeout 1: the idle kept-alive connection is closed after {dt} s")

        # The body deadline: a body that stops arriving gets 408 after 1 s.
        s = raw_socket(srv.port)
        t0 = time.monotonic()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{")
        st, _, _ = read_response(s, 1 + SLACK_S + 3)
        dt = time.monotonic() - t0
        s.close()
        check(st == 408 and 0.9 <= dt <= 1 + SLACK_S, f"--read-timeout 1: a stalled body gets 408 after {dt:.2f} s")

        # The write deadline: 400 pipelined page requests (~26 MB of answers)
        # from a client that never reads; dropped 1 s after the buffers fill.
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((HOST, srv.port))
        page = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        s.sendall(page * 400)
        time.sleep(1 + SLACK_S + 1)
        total = 0
        ended = False
        s.settimeout(5)
        try:
            while True:
                got = s.recv(1 << 20)
                if not got:
                    ended = True
                    break
                total += len(got)
        except socket.timeout:
            pass
        except OSError:
            ended = True
        s.close()
        _, _, one = request(srv.port, "GET", "/")
        check(ended and total < 400 * len(one),
              f"--write-timeout 1: a client that stops reading is dropped ({total >> 10} KiB of "
              f"{400 * len(one) >> 10} KiB read, then {'the end' if ended else 'still open'})")
        st, _, _ = request(srv.port, "GET", "/health", timeout=10)
        check(st == 200, f"served on after the deadlines ({st})")


# ---------------------------------------------------------------------------
# The connection cap

def test_connection_cap() -> None:
    with Server(K3_RUN, MODEL, "--model-id", "k3-tiny", "--max-connections", "4",
                "--max-connections-per-client", "4") as srv:
        # Every connection mid-request (a head begun): the next one is refused
        # with a 503 whose Content-Length is its body's.
        busy = [raw_socket(srv.port) for _ in range(4)]
        for s in busy:
            s.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.3)
        extra = raw_socket(srv.port)
        st, h, body = read_response(extra)
        extra.close()
        try:
            err = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            err = {}
        check(st == 503 and int(h.get("content-length", -1)) == len(body) and err.get("code") == "busy"
              and h.get("retry-after", "").isdigit() and h.get("connection") == "close",
              f"past the cap with every connection mid-request: a whole 503 busy ({st} {h} {body[:120]!r})")
        # The mid-request connections are still served.
        for s in busy:
            s.sendall(b"Host: 127.0.0.1\r\n\r\n")
        served = sum(1 for s in busy if read_response(s)[0] == 200)
        check(served == 4, f"the 4 connections mid-request are answered ({served}/4)")
        for s in busy:
            s.close()


# ---------------------------------------------------------------------------
# Start-up signals

def test_signals_during_load() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        log = f"/tmp/k3-limits-{os.getpid()}-{int(sig)}.log"
        env = dict(os.environ, K3_STALL_AT="serve-load:60", K3_LOG="warn")
        proc = subprocess.Popen([K3_RUN, "serve", MODEL, "--host", HOST, "--port", "0"], stdout=open(log, "wb"),
                                stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                if re.search(rb"listening on", open(log, "rb").read()):
                    break
                time.sleep(0.05)
            port = int(re.search(rb"127\.0\.0\.1:(\d+)", open(log, "rb").read()).group(1))
            st, _, body = request(port, "GET", "/health", timeout=10)
            check(st == 503 and b"loading" in body, f"{sig.name}: /health says loading ({st} {body!r})")
            t0 = time.monotonic()
            proc.send_signal(sig)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            dt = time.monotonic() - t0
            text = open(log, "rb").read().decode("utf-8", "replace")
            check(proc.returncode == -sig and dt < 1.0,
                  f"{sig.name} while the model loads: ended by it in {dt:.2f} s (status {proc.returncode})")
            check("during start-up" in text, f"{sig.name}: the server says it stopped during start-up")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.unlink(log)
    # The hook itself only delays: a short stall, then ready and an ordinary stop.
    with Server(K3_RUN, MODEL, "--model-id", "k3-tiny", env={"K3_STALL_AT": "serve-load:1"}) as srv:
        st, _, _ = request(srv.port, "GET", "/health")
        check(st == 200, f"after a 1 s stall the model is served ({st})")


# ---------------------------------------------------------------------------
# The web page

def test_page_not_framed() -> None:
    with Server(K3_RUN, MODEL, "--model-id", "k3-tiny") as srv:
        st, h, _ = request(srv.port, "GET", "/")
        csp = [d.strip() for d in h.get("content-security-policy", "").split(";")]
        check(st == 200 and "frame-ancestors 'none'" in csp and "default-src 'none'" in csp,
              f"the page's CSP forbids framing ({h.get('content-security-policy')})")
        check(h.get("x-frame-options") == "DENY", f"X-Frame-Options DENY ({h.get('x-frame-options')})")


def main() -> int:
    t_start = time.monotonic()
    run_timed([test_page_not_framed, test_connection_cap, test_deadlines, test_lingering_close,
               test_signals_during_load])
    print(f"total {time.monotonic() - t_start:.1f} s", flush=True)
    return check.done()


if __name__ == "__main__":
    sys.exit(main())

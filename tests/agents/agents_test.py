#!/usr/bin/env python3
"""The agent CLIs against k3's server, unchanged: Claude Code
(`claude -p`, Messages API), Codex (`codex exec`, Responses API) and Qwen Code
(headless, chat completions), each pointed at the server the documented way,
each completing one turn with a tool call and its result; plus the prefill
liveness check (a client whose idle timer counts only data events survives a
prefill three times longer than its timeout, on the chat and Responses routes).

Random weights never call a tool, so the turns come from k3-script-serve: the
real lib/server (routes, parsers, renderer, queue, event writers) on a scripted
token source (tests/server/script_serve.cc). Its transcript shows which turn
each request got and proves the tool's real output reached the next prompt.
The CLIs talk only to 127.0.0.1: telemetry and update checks are off, and any
other address goes to a dead proxy port.

usage: agents_test.py K3_SCRIPT_SERVE MODEL_DIR NODE_MODULES
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from clients import clients

SCRIPT_SERVE, MODEL, MODULES = sys.argv[1:4]
BIN = os.path.join(MODULES, ".bin")
MARKER = "k3-agent-marker-42"
FINAL = "The file holds the marker."
# The final answer runs past 512 tokens (LONG_TAIL, then END): none of these
# CLIs needs to set a cap for it to arrive whole (Codex sets none), so a
# server that cuts answers at a default cap fails here.
END = "k3-answer-end-7"
LONG_TAIL = " ".join(f"line{i} of the long answer," for i in range(300))
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


class ScriptServer:
    def __init__(self, work: str, *args: str):
        self.log = os.path.join(work, f"serve-{len(args)}-{time.monotonic_ns()}.log")
        self.transcript = os.path.join(work, "transcript.log")
        self.proc = subprocess.Popen([SCRIPT_SERVE, MODEL, "--model-id", "k3-script", "--transcript", self.transcript,
                                      *args], stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(self.log).read())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("k3-script-serve did not start: " + open(self.log).read())

    def requests(self) -> list[tuple[str, str]]:
        """(turn, prompt tail) per request so far."""
        if not os.path.exists(self.transcript):
            return []
        text = open(self.transcript, encoding="utf-8", errors="replace").read()
        return re.findall(r"=== request: \d+ prompt tokens -> ([^\n]*)\n(.*?)\n=== end", text, re.S)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_cli(name: str, srv: ScriptServer, argv: list[str], env: dict, cwd: str, tool: str) -> None:
    before = len(srv.requests())
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    took = time.monotonic() - t0
    print(f"----- {name} transcript ({took:.1f} s, exit {p.returncode}) -----\n{p.stdout}{p.stderr}-----", flush=True)
    reqs = srv.requests()[before:]
    for turn, _ in reqs:
        print(f"  server: request -> {turn}")
    check(p.returncode == 0, f"{name}: exits 0")
    check(FINAL in p.stdout, f"{name}: prints the answer that follows the tool result")
    check(END in p.stdout, f"{name}: prints that answer to its end, past 512 tokens ({END})")
    turns = [t for t, _ in reqs]
    check(f"tool_turn {tool}" in turns, f"{name}: the model's {tool} call was sent to the CLI")
    after = [tail for t, tail in reqs if t == "final_turn"]
    check(any(MARKER in tail for tail in after), f"{name}: the tool's real output ({MARKER}) came back in the next prompt")


def idle_timer_check(port: int, path: str, body: dict, idle_s: float, prefill_s: float) -> None:
    """An SSE client whose idle timer, like the SDKs' and agents', is reset only
    by data events (SSE comments are dropped by their parsers)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=prefill_s + 30)
    t0 = time.monotonic()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    last_data = time.monotonic()
    worst = 0.0
    events = 0
    ended = False
    while True:
        line = resp.readline()
        if not line:
            break
        now = time.monotonic()
        if line.startswith(b"data:"):
            worst = max(worst, now - last_data)
            last_data = now
            events += 1
            if line.strip() in (b"data: [DONE]",) or b'"response.completed"' in line:
                ended = True
        if now - last_data > idle_s:
            break
    took = time.monotonic() - t0
    conn.close()
    check(ended and worst < idle_s and took >= prefill_s,
          f"{path}: a {idle_s:.0f} s data-idle timer survives a {prefill_s:.0f} s prefill "
          f"(longest gap between data events {worst:.2f} s, {events} events, {took:.1f} s)")


def main() -> int:
    for tool in ("claude", "codex", "qwen"):
        if not os.path.exists(os.path.join(BIN, tool)):
            print(f"{tool} is not installed under {BIN}")
            return 1
    work = tempfile.mkdtemp(prefix="k3-agents-")
    home = os.path.join(work, "home")
    proj = os.path.join(work, "proj")
    os.makedirs(home)
    os.makedirs(proj)
    hello = os.path.join(proj, "hello.txt")
    with open(hello, "w") as f:
        f.write(MARKER + "\n")
    # One call per agent's tool for reading a file; the first the prompt
    # declares is made (Claude Code: Read, Qwen Code: read_file, Codex:
    # exec_command / shell_command / shell by version).
    turns = {
        "tool_turn": {"reasoning": "Read the file first.", "content": "", "calls": [
            {"name": "Read", "arguments": {"file_path": hello}},
            {"name": "read_file", "arguments": {"file_path": hello}},
            {"name": "exec_command", "arguments": {"cmd": "cat hello.txt"}},
            {"name": "shell_command", "arguments": {"command": "cat hello.txt"}},
            {"name": "shell", "arguments": {"command": ["cat", "hello.txt"]}}]},
        "final_turn": {"reasoning": "I have it.", "content": FINAL + " " + LONG_TAIL + " " + END},
        "plain_turn": {"content": "k3 title"},
    }
    script = os.path.join(work, "turns.json")
    with open(script, "w") as f:
        json.dump(turns, f)
    srv = ScriptServer(work, "--script", script)
    base = f"http://127.0.0.1:{srv.port}"
    prompt = "What does hello.txt say?"
    try:
        # Each CLI's tool for reading a file.
        tools = {"claude -p": "Read", "codex exec": "exec_command", "qwen -p": "read_file"}
        for name, argv, env in clients(BIN, base, work, home, prompt, "k3-script", "sk-k3-test"):
            run_cli(name, srv, argv, env, proj, tools[name])
    finally:
        srv.stop()

    # Liveness: 3 s idle timer vs a 9 s prefill, the same check as a 10 s
    # timer vs a 30 s prefill at a third of the cost.
    slow = ScriptServer(work, "--prefill-s", "9")
    try:
        msgs = [{"role": "user", "content": "hi"}]
        idle_timer_check(slow.port, "/v1/chat/completions", {"model": "k3", "messages": msgs, "stream": True}, 3, 9)
        idle_timer_check(slow.port, "/v1/responses", {"model": "k3", "input": "hi", "stream": True}, 3, 9)
    finally:
        slow.stop()
    shutil.rmtree(work, ignore_errors=True)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

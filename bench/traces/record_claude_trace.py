#!/usr/bin/python3
"""Records the request pattern of an agent session as the pinned Claude Code
(tests/agents) sends it, for `k3-bench agent` (docs/PERFORMANCE.md "Many
requests at once"). No model is involved: a scripted Anthropic Messages
endpoint answers every request at once — the main conversation gets two Task
tool calls (two sub-agents run), each sub-agent a few tool turns then text,
the main conversation's follow-up a final text; side requests (titles,
summaries, quota checks) get a short text. What is kept is the pattern, not
the text (Claude Code's prompts are Anthropic's, under its own terms): per
request its arrival time, which requests had answered before it arrived, the
characters of its system prompt, tool declarations and messages, its
conversation (system prompt + first message) and the earlier request of it
that it extends, a hash of its system prompt + tools (requests with the same
hash share that preamble), max_tokens, and a role (main, sub-agent, side).

Run: /usr/bin/python3 record_claude_trace.py NODE_MODULES > claude-code-subagents.json
(NODE_MODULES: what tests/agents/npm-install.sh prints)."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "agents"))
from clients import clients  # noqa: E402

LOCK = threading.Lock()
T0 = time.monotonic()
RECORDS: list[dict] = []
SUB_TURNS = 2  # tool turns per sub-agent before its text answer
SPAWN_TOOLS = ("Task", "Agent")
MAIN_SYSTEM = None


def chars(x) -> int:
    return len(json.dumps(x, ensure_ascii=False)) if x is not None else 0


def strip_cache(x):
    # Claude Code moves its cache_control markers to the newest message.
    if isinstance(x, dict):
        return {k: strip_cache(v) for k, v in x.items() if k != "cache_control"}
    if isinstance(x, list):
        return [strip_cache(v) for v in x]
    return x


def canon(messages) -> list[str]:
    # One string per message, so that a later request of the same
    # conversation is recognised by its messages starting with these.
    return [json.dumps(strip_cache(m), sort_keys=True, ensure_ascii=False) for m in messages]


def tool_results(messages) -> int:
    n = 0
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), list):
            n += sum(1 for c in m["content"] if isinstance(c, dict) and c.get("type") == "tool_result")
    return n


def sse(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def answer_events(blocks: list[dict], stop: str) -> list[bytes]:
    out = [sse("message_start", {"type": "message_start", "message": {
        "id": "msg_trace", "type": "message", "role": "assistant", "model": "k3", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}})]
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            out.append(sse("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": {"type": "text", "text": ""}}))
            out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                   "delta": {"type": "text_delta", "text": b["text"]}}))
        else:
            out.append(sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}}))
            out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(b["input"])}}))
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"output_tokens": 10}}))
    out.append(sse("message_stop", {"type": "message_stop"}))
    return out


def whole(blocks: list[dict], stop: str) -> dict:
    content = [{"type": "text", "text": b["text"]} if b["type"] == "text" else
               {"type": "tool_use", "id": b["id"], "name": b["name"], "input": b["input"]} for b in blocks]
    return {"id": "msg_trace", "type": "message", "role": "assistant", "model": "k3", "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 10}}


class Endpoint(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
            data = json.dumps({"input_tokens": max(1, len(raw) // 4)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        messages = body.get("messages") or []
        tools = [t.get("name") for t in body.get("tools") or []]
        done = tool_results(messages)
        with LOCK:
            arrive = time.monotonic() - T0
            # A conversation: its system prompt and first message (Claude
            # Code rewrites reminders inside later ones); a request extends
            # the previous one of its conversation.
            mine = canon([body.get("system")] + messages[:1])
            parent = None
            for r in reversed(RECORDS):
                if r["canon"] == mine:
                    parent = r["n"]
                    break
            conversation = RECORDS[parent]["conversation"] if parent is not None else \
                1 + max([r["conversation"] for r in RECORDS], default=-1)
            n = len(RECORDS)
            # The main conversation: the system prompt of the first request
            # that could spawn sub-agents; only it spawns them.
            global MAIN_SYSTEM
            spawn = next((s for s in SPAWN_TOOLS if s in tools), None)
            if spawn and MAIN_SYSTEM is None:
                MAIN_SYSTEM = canon([body.get("system")])
            if spawn and canon([body.get("system")]) != MAIN_SYSTEM:
                spawn = None
            if spawn and done == 0:
                role, stop = "main", "tool_use"
                blocks = [{"type": "tool_use", "id": f"toolu_trace_{n}_{k}", "name": spawn, "input": {
                    "description": f"part {k + 1}", "subagent_type": "general-purpose",
                    "prompt": f"Look at part {k + 1} of the project: list the files in this folder and "
                              f"read README.md, then report in one line."}} for k in range(2)]
            elif spawn:
                role, stop, blocks = "main", "end_turn", [{"type": "text", "text": "Both parts are done."}]
            elif tools and done < SUB_TURNS:
                role, stop = "sub-agent", "tool_use"
                name = "Bash" if "Bash" in tools else tools[0]
                blocks = [{"type": "tool_use", "id": f"toolu_trace_{n}", "name": name,
                           "input": {"command": "ls", "description": "list files"} if name == "Bash" else {}}]
            elif tools:
                role, stop, blocks = "sub-agent", "end_turn", [{"type": "text", "text": "README.md says hello."}]
            else:
                role, stop, blocks = "side", "end_turn", [{"type": "text", "text": "Project check"}]
            if parent is not None and RECORDS[parent]["role"] != "side" and role == "side":
                role = RECORDS[parent]["role"]
            RECORDS.append({"n": n, "canon": mine, "arrive_s": round(arrive, 3), "role": role,
                            "conversation": conversation,
                            "answered_before": [r["n"] for r in RECORDS if r.get("answered_s") is not None],
                            "extends": parent, "system_chars": chars(body.get("system")),
                            "tools_chars": chars(body.get("tools")), "tools": len(tools),
                            "preamble": hashlib.sha256(json.dumps(
                                [strip_cache(body.get("system")), strip_cache(body.get("tools"))],
                                sort_keys=True).encode()).hexdigest()[:12],
                            "messages_chars": chars(messages), "messages": len(messages),
                            "max_tokens": body.get("max_tokens"), "stream": bool(body.get("stream")),
                            "answer": stop})
        if body.get("stream"):
            events = answer_events(blocks, stop)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(sum(len(e) for e in events)))
            self.end_headers()
            for e in events:
                self.wfile.write(e)
        else:
            data = json.dumps(whole(blocks, stop)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        with LOCK:
            RECORDS[n]["answered_s"] = round(time.monotonic() - T0, 3)


def main() -> int:
    modules = sys.argv[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:%d" % server.server_address[1]
    work = tempfile.mkdtemp(prefix="k3-trace-")
    home, proj = os.path.join(work, "home"), os.path.join(work, "proj")
    os.makedirs(home)
    os.makedirs(proj)
    with open(os.path.join(proj, "README.md"), "w") as f:
        f.write("hello\n")
    prompt = "Split this job in two and run both parts as sub-agents at once: look at the project and report."
    name, argv, env = clients(os.path.join(modules, ".bin"), base, work, home, prompt, "k3", "sk-trace")[0]
    p = subprocess.run(argv, env=env, cwd=proj, capture_output=True, timeout=300)
    server.shutdown()
    version = subprocess.run([os.path.join(modules, ".bin", "claude"), "--version"], env=env,
                             capture_output=True, text=True).stdout.strip()
    for r in RECORDS:
        del r["canon"]
    json.dump({"client": f"claude-code {version}", "prompt": prompt, "exit": p.returncode,
               "requests": RECORDS}, sys.stdout, indent=1)
    print()
    roles = [r["role"] for r in RECORDS]
    print(f"{len(RECORDS)} requests: {roles.count('main')} main, {roles.count('sub-agent')} sub-agent, "
          f"{roles.count('side')} side; claude exit {p.returncode}", file=sys.stderr)
    if p.returncode != 0:
        print(p.stderr.decode(errors="replace")[-2000:], file=sys.stderr)
    return 0 if roles.count("sub-agent") >= 2 and p.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""The tool schemas the agent CLIs really send, taken from their first requests
to a local recorder (no model involved), as a schema corpus for
tests/constrain/corpus_test.py. The CLIs are the ones tests/agents pins
(Claude Code, Codex, Qwen Code from npm); each is pointed at the recorder the
way agents_test.py points it at k3, sends its first request with its built-in
tools, gets a 400 and exits. Captured at test time, not committed: Claude
Code's schemas are Anthropic's, under its own terms.

Tools become corpus entries named "<client>/<tool>": Claude Code's
`input_schema` (Messages API), Codex's function `parameters` (Responses API;
its freeform tools, such as a grammar-defined apply_patch, carry no JSON
Schema and are listed on stderr only), Qwen Code's `function.parameters`
(chat completions).

Run: /usr/bin/python3 capture_tools.py NODE_MODULES > captured.json
(NODE_MODULES: the folder tests/agents/npm-install.sh prints). Exits 1 when a
client sent fewer than 5 tools with schemas (a capture that failed)."""
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading

from clients import clients

BODIES = []


class Recorder(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        try:
            BODIES.append((self.path, json.loads(raw)))
        except ValueError:
            pass
        msg = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "recorded",
                                                      "code": "recorded"}}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(msg)))
        self.end_headers()
        self.wfile.write(msg)

    def do_GET(self):
        self.do_POST()

    def log_message(self, *args):
        pass


def run(argv, env, cwd):
    try:
        subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        print("timed out: " + argv[0], file=sys.stderr)


def main():
    modules = sys.argv[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:%d" % server.server_address[1]
    work = tempfile.mkdtemp(prefix="k3-capture-")
    home = os.path.join(work, "home")
    proj = os.path.join(work, "proj")
    os.makedirs(home)
    os.makedirs(proj)
    prompt = "What does hello.txt say?"
    runs = []
    for name, argv, env in clients(os.path.join(modules, ".bin"), base, work, home, prompt, "k3", "sk-capture",
                                   codex_retries=False):
        start = len(BODIES)
        run(argv, env, proj)
        runs.append((argv[0], start, len(BODIES)))
    server.shutdown()

    corpus, seen, short = [], set(), False
    for client, a, b in runs:
        found = 0
        for path, body in BODIES[a:b]:
            tools = list(body.get("tools") or [])
            # Codex groups some tools in a namespace; its members are tools too.
            for t in list(tools):
                if t.get("type") == "namespace":
                    tools.extend(t.get("tools") or [])
            for t in tools:
                if t.get("type") == "namespace":
                    continue
                if client == "claude":
                    name, schema = t.get("name"), t.get("input_schema")
                elif client == "codex":
                    name, schema = t.get("name"), t.get("parameters")
                else:
                    fn = t.get("function") or {}
                    name, schema = fn.get("name"), fn.get("parameters")
                if not name or (client, name) in seen:
                    continue
                if not isinstance(schema, dict):
                    print("%s: %s (type %s) has no JSON Schema" % (client, name, t.get("type")), file=sys.stderr)
                    continue
                seen.add((client, name))
                corpus.append({"name": "%s/%s" % (client, name), "schema": schema})
                found += 1
        print("%s: %d requests, %d tools with schemas" % (client, b - a, found), file=sys.stderr)
        short |= found < 5
    sys.stdout.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in corpus) + "\n]\n")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())

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


def env_for(home, modules, **extra):
    env = {"PATH": os.path.join(modules, ".bin") + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
           "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb", "CI": "1",
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    env.update(extra)
    return env


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
    start = len(BODIES)
    run(["claude", "-p", prompt, "--model", "k3"],
        env_for(home, modules, ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY="sk-capture", DISABLE_TELEMETRY="1",
                DISABLE_ERROR_REPORTING="1", DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1"),
        proj)
    runs.append(("claude", start, len(BODIES)))
    start = len(BODIES)
    codex_home = os.path.join(work, "codex")
    os.makedirs(codex_home)
    with open(os.path.join(codex_home, "config.toml"), "w") as f:
        f.write('model = "k3"\nmodel_provider = "k3"\ncheck_for_update_on_startup = false\n\n'
                '[model_providers.k3]\nname = "k3"\nbase_url = "%s/v1"\nwire_api = "responses"\n'
                'env_key = "K3_API_KEY"\nrequest_max_retries = 0\nstream_max_retries = 0\n\n'
                '[analytics]\nenabled = false\n\n[otel]\nexporter = "none"\n' % base)
    run(["codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt],
        env_for(home, modules, CODEX_HOME=codex_home, K3_API_KEY="sk-capture"), proj)
    runs.append(("codex", start, len(BODIES)))
    start = len(BODIES)
    os.makedirs(os.path.join(home, ".qwen"), exist_ok=True)
    with open(os.path.join(home, ".qwen", "settings.json"), "w") as f:
        json.dump({"telemetry": {"enabled": False}, "privacy": {"usageStatisticsEnabled": False},
                   "general": {"disableAutoUpdate": True, "disableUpdateNag": True}}, f)
    run(["qwen", "-p", prompt, "--auth-type", "openai"],
        env_for(home, modules, OPENAI_BASE_URL=base + "/v1", OPENAI_API_KEY="sk-capture", OPENAI_MODEL="k3"), proj)
    runs.append(("qwen", start, len(BODIES)))
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

#!/usr/bin/python3
"""The schema compile budget through `k3-run serve` (docs/server.md, "Schema
compile budget"): one request's schemas, every tool's parameters and
response_format together, may not buy more than about a second of one core
and tens of MB, however they respect the caps of one pattern or one schema.

* a strict tool whose parameters are 64 objects of 64 string properties, each
  with the pattern (a|b)*a(a|b){8} (each pattern's automaton about 2^9
  states, within every per-pattern cap): a 400 naming the budget within a
  few seconds, the server's RSS (VmRSS) grows by less than 200 MB and does
  not creep when the request is repeated;
* the same shape as response_format's json_schema: the same 400;
* tools that fit the budget alone, with a response_format that would fit
  alone too: together a 400 naming the budget, on response_format;
* the same tool not strict (through count_tokens, which compiles without a
  prefill): relaxed (200), never refused, as fast;
* 2,000 patterned properties: the properties cap refuses it before any of
  them compiles (fast);
* after all of it the server still answers a plain request.

usage: schema_budget_test.py K3_RUN MODEL_DIR
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_lib import Check, Server, request, user  # noqa: E402

K3_RUN, MODEL = sys.argv[1], sys.argv[2]
check = Check()

HEAVY = "(a|b)*a(a|b){8}"
MAX_SECONDS = 3.0  # wall clock, as the client sees it
MAX_CPU_SECONDS = 1.5  # the server's CPU for the request (steady under load)
MAX_RSS_GROWTH_KIB = 200 * 1024
# Without the budget the reported request compiles for minutes: wait this long
# for an answer, then count it as failed (rather than hang the suite).
ANSWER_TIMEOUT_S = 60


def patterned(pattern):
    return {"type": "string", "pattern": pattern}


def grid(objects, props, pattern=HEAVY):
    return {"type": "object", "properties": {
        f"group_{i:02d}": {"type": "object", "properties": {f"field_{j:02d}": patterned(pattern) for j in range(props)}}
        for i in range(objects)}}


def tool(name, parameters, strict=True):
    return {"type": "function", "function": {"name": name, "description": "a tool", "strict": strict,
                                             "parameters": parameters}}


def cpu_seconds(pid):
    """utime + stime of the process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def post(port, body):
    """(status, parsed body, seconds)."""
    data = json.dumps(body).encode()
    t0 = time.monotonic()
    status, _, raw = request(port, "POST", "/v1/chat/completions", data, {"Content-Type": "application/json"},
                             timeout=ANSWER_TIMEOUT_S)
    elapsed = time.monotonic() - t0
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw
    return status, parsed, elapsed


def message(parsed):
    try:
        return parsed["error"]["message"]
    except (TypeError, KeyError):
        return str(parsed)[:300]


def expect_budget_400(srv, name, body, param_prefix):
    size = len(json.dumps(body))
    cpu0 = cpu_seconds(srv.proc.pid)
    status, parsed, elapsed = post(srv.port, body)
    cpu = cpu_seconds(srv.proc.pid) - cpu0
    text = message(parsed)
    print(f"{name}: {size} bytes -> {status} in {elapsed:.2f} s ({cpu:.2f} s of server CPU): {text[:160]}",
          flush=True)
    check(status == 400, f"{name}: 400, got {status}")
    check("schema compile budget" in text, f"{name}: the error names the budget: {text[:200]}")
    param = parsed.get("error", {}).get("param") if isinstance(parsed, dict) else None
    check(isinstance(param, str) and param.startswith(param_prefix),
          f"{name}: param starts with {param_prefix!r}, got {param!r}")
    check(elapsed < MAX_SECONDS, f"{name}: answered in {elapsed:.2f} s, under {MAX_SECONDS} s")
    check(cpu < MAX_CPU_SECONDS, f"{name}: {cpu:.2f} s of server CPU, under {MAX_CPU_SECONDS} s")


def still_serves(srv, after):
    status, parsed, _ = post(srv.port, {"messages": user("hi"), "max_tokens": 2})
    check(status == 200, f"after {after}: a plain request gets 200, got {status} {message(parsed)[:200]}")
    check(srv.alive(), f"after {after}: the server is alive")


def main() -> int:
    with Server(K3_RUN, MODEL, "--model-id", "k3-tiny") as srv:
        still_serves(srv, "start")
        rss0 = srv.rss_kib()

        reported = {"messages": user("fill the form"), "max_tokens": 8, "tools": [tool("form", grid(64, 64))]}
        size = len(json.dumps(reported))
        check(size > 250_000, f"the reported request is about 260 KB ({size} bytes)")
        for attempt in range(3):  # repeated: nothing it built may stay behind
            expect_budget_400(srv, f"strict tool, 64x64 patterns (try {attempt + 1})", reported, "tools")
            growth = srv.rss_kib() - rss0
            print(f"  RSS growth {growth / 1024:.1f} MB", flush=True)
            check(growth < MAX_RSS_GROWTH_KIB, f"RSS grew by {growth / 1024:.0f} MB, under 200 MB")
        still_serves(srv, "the reported request")

        as_response = {"messages": user("fill the form"), "max_tokens": 8,
                       "response_format": {"type": "json_schema",
                                           "json_schema": {"name": "form", "strict": True, "schema": grid(64, 64)}}}
        expect_budget_400(srv, "response_format, 64x64 patterns", as_response, "response_format")

        # Each fits the budget alone (32 such patterns take about 40 %); together they do not.
        part = grid(1, 32)
        together = {"messages": user("fill the form"), "max_tokens": 8,
                    "tools": [tool("one", part), tool("two", grid(1, 32, "(c|d)*c(c|d){8}"))],
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "form", "strict": True,
                                                        "schema": grid(1, 32, "(e|f)*e(e|f){8}")}}}
        # (Not one of those three: a cached schema costs a later request nothing.)
        alone = {"messages": user("fill the form"), "max_tokens": 1,
                 "tools": [tool("one", grid(1, 32, "(g|h)*g(g|h){8}"))], "tool_choice": "none"}
        status, parsed, _ = post(srv.port, alone)
        check(status == 200, f"one of those tools alone fits the budget: {status} {message(parsed)[:200]}")
        expect_budget_400(srv, "tools + response_format together", together, "response_format")

        # Not strict (an Anthropic tool without "strict"), through count_tokens: the same parse,
        # render and schema compile as a chat, without the prefill of a 260 KB prompt (the
        # model's time after the queue, not the compiler's).
        m_tool = {"name": "form", "description": "a tool", "input_schema": grid(64, 64)}
        relaxed = {"model": "k3-tiny", "messages": user("fill the form"), "tools": [m_tool]}
        cpu0 = cpu_seconds(srv.proc.pid)
        t0 = time.monotonic()
        status, _, raw = request(srv.port, "POST", "/v1/messages/count_tokens", json.dumps(relaxed).encode(),
                                 {"Content-Type": "application/json"}, timeout=ANSWER_TIMEOUT_S)
        elapsed, cpu = time.monotonic() - t0, cpu_seconds(srv.proc.pid) - cpu0
        print(f"non-strict tool, 64x64 patterns (count_tokens) -> {status} in {elapsed:.2f} s "
              f"({cpu:.2f} s of server CPU): {raw[:120]!r}", flush=True)
        check(status == 200, f"a non-strict tool past the budget is relaxed, not refused: {status} {raw[:200]!r}")
        check(elapsed < MAX_SECONDS, f"the non-strict request answered in {elapsed:.2f} s, under {MAX_SECONDS} s")
        check(cpu < MAX_CPU_SECONDS, f"the non-strict request: {cpu:.2f} s of server CPU, under {MAX_CPU_SECONDS} s")

        wide = {"messages": user("fill the form"), "max_tokens": 8,
                "tools": [tool("wide", {"type": "object",
                                        "properties": {f"f{i}": patterned(HEAVY) for i in range(2000)}})]}
        status, parsed, elapsed = post(srv.port, wide)
        text = message(parsed)
        print(f"2,000 patterned properties -> {status} in {elapsed:.2f} s: {text[:160]}", flush=True)
        check(status == 400 and "more than 64 properties" in text, f"2,000 properties: 400 naming the cap: {text[:200]}")
        check(elapsed < 1.5, f"2,000 properties refused before compiling them: {elapsed:.2f} s")

        growth = srv.rss_kib() - rss0
        print(f"RSS growth after every case: {growth / 1024:.1f} MB", flush=True)
        check(growth < MAX_RSS_GROWTH_KIB, f"RSS grew by {growth / 1024:.0f} MB in all, under 200 MB")
        still_serves(srv, "every case")
    return check.done()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Structured output through `k3-run serve` on the random-weight tiny model
(docs/server.md, "Structured output"), whose unconstrained output is garbage, checked with Debian's
python3-jsonschema, an implementation independent of k3:

* every schema of tests/constrain/schemas.json (42 hand-written tool and
  structured-output schemas + 208 seeded random ones from gen_schemas.py, which
  cover nesting, arrays, enums, const, anyOf/oneOf, bounds, optional and
  required properties, additionalProperties false, $ref, unicode and
  escape-heavy keys, + 16 with `pattern` strings and integer bounds beyond
  +-1e15) as response_format json_schema: the answer is compact JSON
  (no whitespace outside strings) that validates; finish_reason "stop";
* every object schema as a tool's parameters with tool_choice "required" or
  named (alternating): the call names a declared tool (the named one when
  named), its arguments parse and validate, finish_reason "tool_calls";
* each request twice, non-streamed and streamed with the same seed: the
  streamed deltas (content, argument fragments) concatenate to the same answer;
* json_object answers are objects; tool_choice none makes no call;
* schemas k3 cannot enforce are 400s naming the parameter and the keyword.

usage: structured_test.py K3_RUN MODEL_DIR
"""
import json
import re
import os
import sys

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "constrain"))
from check_outputs import compact  # noqa: E402
from serve_lib import Check, Server, accumulate, chat, user  # noqa: E402

# The tiny model's 2,048-rank vocabulary spells JSON almost byte by byte, so the
# shortest forced call of the larger schemas needs ~100 tokens.
MAX_TOKENS = 160


def validate(schema, value):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = sorted(cls(schema).iter_errors(value), key=str)
    return errors[0].message if errors else None


def strict_loads(text):
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def both(port, body):
    """(non-streamed message, finish), (streamed accumulated message, finish)."""
    s1, _, whole = chat(port, dict(body, stream=False))
    s2, _, events = chat(port, dict(body, stream=True))
    if s1 != 200 or s2 != 200:
        return None, None, f"status {s1} / {s2}: {str(whole)[:300]}"
    m = whole["choices"][0]["message"]
    a = accumulate(events)
    return (m, whole["choices"][0]["finish_reason"]), (a["message"], a["finish_reason"]), None


def calls_of(message):
    """[(id, name, arguments)] from a non-streamed message or an accumulated one."""
    tc = message.get("tool_calls") or []
    if isinstance(tc, dict):
        return [(v["id"], v["name"], v["arguments"]) for _, v in sorted(tc.items())]
    return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in tc]


def check_json_answer(check, what, schema, text):
    try:
        value = strict_loads(text)
    except ValueError as e:
        return check(False, f"{what}: does not parse ({e}): {text!r}")
    check(compact(text) and "\n" not in text and "\t" not in text, f"{what}: not compact: {text!r}")
    if schema is None:
        return check(isinstance(value, dict), f"{what}: json_object answer is not an object: {text!r}")
    err = validate(schema, value)
    return check(err is None, f"{what}: does not validate ({err}): {text!r}")


def json_complete(schema, text):
    """The answer parses and validates: only its end-of-message was cut."""
    try:
        value = strict_loads(text)
    except ValueError:
        return False
    return schema is None or validate(schema, value) is None


def main():
    k3_run, model = sys.argv[1], sys.argv[2]
    entries = json.load(open(os.path.join(HERE, "..", "constrain", "schemas.json"), encoding="utf-8"))
    check = Check()
    n_json = n_calls = 0
    n_closed_on_budget = 0
    with Server(k3_run, model, "--max-tokens", str(MAX_TOKENS)) as srv:
        for i, e in enumerate(entries):
            name, schema = e["name"], e["schema"]
            thinking = {"type": "enabled" if i % 4 == 1 else "disabled"}
            # response_format: json_schema (json_object for the null schema).
            if schema is None:
                rf = {"type": "json_object"}
            else:
                rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
            body = {"model": "k3-tiny", "messages": user("Reply with JSON."), "response_format": rf,
                    "seed": 1000 + i, "thinking": thinking}
            plain, streamed, err = both(srv.port, body)
            if not check(err is None, f"{name} json: {err}"):
                continue
            for (m, finish), mode in ((plain, "plain"), (streamed, "stream")):
                what = f"{name} json {mode}"
                # Steering toward the close is a margin, not a proof (a sampled
                # multi-byte token can lengthen the shortest completion): an
                # answer whose JSON closed on the budget's last token but whose
                # end-of-message did not fit is counted, and must stay rare.
                if finish == "length" and json_complete(schema, m["content"] or ""):
                    n_closed_on_budget += 1
                    print(f"   {what}: JSON complete on the last token, end-of-message cut", flush=True)
                else:
                    check(finish == "stop", f"{what}: finish_reason {finish}")
                check(not calls_of(m), f"{what}: a tool call in a JSON answer")
                check_json_answer(check, what, schema, m["content"] or "")
            check(plain[0]["content"] == streamed[0]["content"],
                  f"{name}: streamed content differs: {plain[0]['content']!r} vs {streamed[0]['content']!r}")
            n_json += 1

            # Tool calls: arguments are an object; other schemas become its one property.
            if schema is None:
                schema = {"type": "object"}
            elif not isinstance(schema, dict) or schema.get("type") != "object":
                schema = {"type": "object", "properties": {"value": schema}, "required": ["value"],
                          "additionalProperties": False}
            tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "A tool.",
                                                       "parameters": schema, "strict": i % 3 == 0}},
                     {"type": "function", "function": {"name": "other", "parameters": {
                         "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}]
            named = i % 2 == 0
            choice = {"type": "function", "function": {"name": f"tool_{i}"}} if named else "required"
            body = {"model": "k3-tiny", "messages": user("Call a tool."), "tools": tools, "tool_choice": choice,
                    "seed": 2000 + i, "thinking": {"type": "enabled" if i % 4 == 3 else "disabled"}}
            plain, streamed, err = both(srv.port, body)
            if not check(err is None, f"{name} call: {err}"):
                continue
            by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            for (m, finish), mode in ((plain, "plain"), (streamed, "stream")):
                what = f"{name} call {mode} ({'named' if named else 'required'})"
                check(finish == "tool_calls", f"{what}: finish_reason {finish}")
                calls = calls_of(m)
                if not check(len(calls) >= 1, f"{what}: no call"):
                    continue
                for cid, fname, args in calls:
                    check(fname in by_name, f"{what}: undeclared tool {fname!r}")
                    if named:
                        check(fname == f"tool_{i}", f"{what}: named choice, but called {fname!r}")
                    if fname in by_name:
                        check_json_answer(check, f"{what} {fname}", by_name[fname], args)
            check(calls_of(plain[0]) == calls_of(streamed[0]),
                  f"{name}: streamed calls differ: {calls_of(plain[0])} vs {calls_of(streamed[0])}")
            n_calls += 1

        # tool_choice none: no call can open, whatever the model samples.
        for seed in range(6):
            s, _, r = chat(srv.port, {"messages": user("Call a tool?"), "seed": seed, "tool_choice": "none",
                                      "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                                          "type": "object"}}}]})
            check(s == 200 and not calls_of(r["choices"][0]["message"]), f"tool_choice none seed {seed}: {r}")

        # Strict schemas outside the subset: 400 naming the parameter and the keyword.
        lookahead = {"type": "object", "properties": {"pw": {"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]{8}$"}},
                     "required": ["pw"]}
        bad = [
            ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": lookahead}}],
              "tool_choice": "required"}, "tools[0].function.parameters", "pattern"),
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                        {"type": "function", "function": {"name": "g", "strict": True, "parameters": {
                            "type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}}}]},
             "tools[1].function.parameters", "if"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
                "type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}}}}},
             "response_format.json_schema.schema", "multipleOf"),
            ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "string"}}}]},
             "tools[0].function.parameters", "object"),
            ({"tools": [{"type": "function", "function": {"name": "f"}}],
              "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice.function.name", '"g"'),
        ]
        for extra, param, keyword in bad:
            for stream in (False, True):
                s, _, r = chat(srv.port, dict({"messages": user("x"), "stream": stream}, **extra))
                ok = s == 400 and isinstance(r, dict) and r["error"]["param"] == param and \
                    keyword in r["error"]["message"]
                check(ok, f"unsupported {param} {keyword} stream={stream}: {s} {r}")
        # Not strict: the same lookahead schema is relaxed, never refused; the forced
        # call's arguments meet what is enforced (the [a-z0-9]{8} part).
        for stream in (False, True):
            s, _, r = chat(srv.port, {"messages": user("x"), "stream": stream, "tool_choice": "required",
                                      "tools": [{"type": "function", "function": {"name": "f", "parameters": lookahead}}]})
            check(s == 200, f"non-strict lookahead tool stream={stream}: {s} {str(r)[:300]}")
            if s == 200 and not stream:
                args = json.loads(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
                check(re.fullmatch(r"[a-z0-9]{8}", args["pw"]) is not None, f"relaxed pattern not enforced: {args}")
        check(srv.alive(), "server still up")
    print(f"structured: {n_json} schemas as json_schema, {n_calls} as forced tool calls, each streamed and not")
    check(n_json >= 266 and n_calls >= 266, f"too few cases ran: {n_json} json, {n_calls} calls")
    check(n_closed_on_budget <= 4, f"{n_closed_on_budget} JSON answers closed only on the budget's last token")
    return check.done()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Regenerates kvv.json: the schemas KVV's tool_call_json_schema group sends
as a forced tool's `parameters` (MoonshotAI/Kimi-Vendor-Verifier, MIT; its
testdata/walle_validator_cases snapshot of MoonshotAI/walle's validator
cases). Each valid.jsonl line becomes one tool schema the way KVV sends it:
the case schema as the single required property `value` of an object that
allows nothing else, a root self-reference (`$ref: "#"`) moved to a `$defs`
entry so it still names the case schema, the case's `$defs` and `$id` kept
at the top. Of KVV's own skips only one is applied: a string with minLength over 1000
(k3 enforces it as written, so the answer runs to max_tokens, as KVV
expects of every provider); exotic keys, `default` and recursive references
go to k3 as they come. A case that is not JSON or holds a non-finite number
cannot be sent, so it is left out too.

Run: /usr/bin/python3 gen_kvv.py KVV_CHECKOUT > kvv.json"""
import json
import math
import os
import sys


def finite(v):
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, list):
        return all(finite(x) for x in v)
    if isinstance(v, dict):
        return all(finite(x) for x in v.values())
    return True


def refs(v):
    if isinstance(v, dict):
        return ([v["$ref"]] if "$ref" in v else []) + [r for x in v.values() for r in refs(x)]
    if isinstance(v, list):
        return [r for x in v for r in refs(x)]
    return []


def retarget(v, to):
    if isinstance(v, dict):
        return {k: (to if k == "$ref" and x == "#" else retarget(x, to)) for k, x in v.items()}
    if isinstance(v, list):
        return [retarget(x, to) for x in v]
    return v


def as_tool(schema):
    if not isinstance(schema, dict):
        return {"type": "object", "required": ["value"], "additionalProperties": False,
                "properties": {"value": schema}}
    out = {"type": "object", "required": ["value"], "additionalProperties": False}
    body = lambda s: {k: x for k, x in s.items() if k not in ("$defs", "$id")}
    if "#" in refs(schema):
        defs = dict(schema.get("$defs", {}))
        name = "case"
        while name in defs:
            name = "_" + name
        moved = retarget(schema, "#/$defs/" + name)
        defs.update(moved.get("$defs", {}))
        defs[name] = body(moved)
        out["properties"] = {"value": {"$ref": "#/$defs/" + name}}
        out["$defs"] = defs
    else:
        out["properties"] = {"value": body(schema)}
        if "$defs" in schema:
            out["$defs"] = schema["$defs"]
    if "$id" in schema:
        out["$id"] = schema["$id"]
    return out


def main():
    root = os.path.join(sys.argv[1], "testdata", "walle_validator_cases", "validator_cases")
    corpus = []
    for suite in sorted(os.listdir(root)):
        path = os.path.join(root, suite, "valid.jsonl")
        if not os.path.isfile(path):
            continue
        for n, line in enumerate(open(path, encoding="utf-8"), start=1):
            if not line.strip():
                continue
            try:
                schema = json.loads(line)
            except ValueError:
                continue
            extreme = isinstance(schema, dict) and schema.get("type") == "string" and \
                schema.get("minLength", 0) > 1000
            if finite(schema) and not extreme:
                corpus.append({"name": "kvv/%s:%d" % (suite, n), "schema": as_tool(schema)})
    # One case a line: a diff shows which case changed.
    sys.stdout.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in corpus) + "\n]\n")


if __name__ == "__main__":
    main()

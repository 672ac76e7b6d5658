#!/usr/bin/python3
"""Corpus test: real tool schemas (corpus/*.json: Claude Code's tool
inputs and common zod types as zod 4 emits them, pydantic models, Qwen Code's
tool declarations, and hand-made schemas that need relaxing).

1. Every schema compiles non-strict (a non-strict tool is never refused), and
   RUNS seeded random generations over the k3-tiny vocabulary each end in a
   compact JSON value that python3-jsonschema validates against the schema as
   relaxed: the original with each noted relaxation applied (the keyword
   dropped at its pointer, oneOf read as anyOf).
2. The relaxation is a superset: random candidate instances (compact, in k3's
   spellings: declared keys only, short decimals, no exponents) that are valid
   under the ORIGINAL schema (formats asserted as the patterns k3 enforces)
   are all accepted by the non-strict automaton.

    corpus_test.py CONSTRAIN_DRIVE MODEL_DIR RUNS [CORPUS.json ...]

Without corpus files: every corpus/*.json here. tests/agents/tool_schemas.sh
passes the tools the agent CLIs send, captured at test time.
"""
import copy
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile

import jsonschema

from check_outputs import outside_strings

HERE = os.path.dirname(os.path.abspath(__file__))
# Caps on what goes unchecked, each at today's count for corpus/ (the
# schemas are printed by name at the end of main):
# - every relaxation the corpus needs maps to a schema python-jsonschema can
#   validate, so no generation is left as "any value";
# - zod/emoji's \p{Extended_Pictographic}: Python's re has no \p{..};
# - the candidate generator draws strings from STRINGS and keys from
#   `properties`: pydantic/Event and zod/formats require several formatted
#   strings at once (uuid, date-time, date...), which 300 draws never all
#   hit, and zod/record-enum-keys requires keys that only propertyNames
#   names. The agent CLIs' tools (tests/agents/tool_schemas.sh) fit the same caps.
MAX_UNVALIDATED = 0
MAX_UNREADABLE = 1
MAX_WITHOUT_CANDIDATES = 3

# k3's format patterns (lib/constrain/src/schema.cc FormatPattern): validity
# in step 2 asserts the formats as k3 enforces them (it narrows by design).
DATE = r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
FORMATS = {
    "date": DATE, "time": TIME, "date-time": DATE + "T" + TIME,
    "email": r"[A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:(?:[A-Za-z0-9._~:/?#@!$&'()*+,;=-]|%[0-9A-Fa-f]{2})+",
    "ipv4": r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    "ipv6": r"(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}",
}
K3_FORMATS = jsonschema.FormatChecker(formats=())
for _name, _rx in FORMATS.items():
    K3_FORMATS.checks(_name)(lambda v, rx=re.compile(_rx): not isinstance(v, str) or rx.fullmatch(v) is not None)


def validator(schema, formats=None):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema, format_checker=formats)


def at(doc, pointer):
    node = doc
    for tok in [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:] if t != ""]:
        node = node[int(tok)] if isinstance(node, list) else node[tok]
    return node


def relaxed_schema(schema, relaxations):
    """The schema as k3 enforces it at most: each relaxation applied (None: any value)."""
    out = copy.deepcopy(schema)
    for r in relaxations:
        if r["keyword"] == "schema":
            return None
        node = at(out, r["pointer"])
        kw = r["keyword"]
        if kw == "oneOf":
            node["anyOf"] = node.pop("oneOf")
        elif kw == "allOf" or kw == "$ref":
            return None  # a merge that kept one side: validated as any value
        elif kw == "prefixItems":
            node.pop("prefixItems", None)
            node.pop("items", None)
        elif kw == "properties":
            return None
        else:
            node.pop(kw, None)
            if kw in ("exclusiveMinimum", "exclusiveMaximum", "minimum", "maximum") and "bounds dropped" in r["what"]:
                for b in ("exclusiveMinimum", "exclusiveMaximum", "minimum", "maximum"):
                    node.pop(b, None)
    return out


def outside_ws(text):
    return any(ch in " \t\r\n" for _, ch in outside_strings(text))


# ---- candidate instances for the superset check ----
STRINGS = ["", "a", "abc", "all", "12", "0", "A1", "Kx3", "k123", "x-y", "2024-02-28", "2024-02-28T12:30:00Z",
           "12:30:00Z", "a.b@example.com", "123e4567-e89b-12d3-a456-426614174000", "https://example.com/a",
           "10.0.0.1", "1:2:3:4:5:6:7:8", "\U0001F600", "<b>x</b>", "x", "circle", "rect", "pending", "code",
           "content", "celsius", "meeting", "y", "A_1", "12345"]


def candidate(schema, root, rng, depth=0):
    if isinstance(schema, bool):
        return 1
    if "$ref" in schema:
        return candidate(at(root, schema["$ref"][1:]), root, rng, depth + 1)
    for kw in ("anyOf", "oneOf"):
        if kw in schema:
            return candidate(rng.choice(schema[kw]), root, rng, depth + 1)
    if "allOf" in schema and schema["allOf"] and not all(set(s) <= {"pattern"} for s in schema["allOf"]):
        merged = {}
        for s in schema["allOf"]:
            s = at(root, s["$ref"][1:]) if "$ref" in s else s
            for k, v in s.items():
                if k == "properties":
                    merged.setdefault("properties", {}).update(v)
                elif k == "required":
                    merged.setdefault("required", []).extend(v)
                else:
                    merged[k] = v
        for k, v in schema.items():
            if k != "allOf":
                merged.setdefault(k, v)
        return candidate(merged, root, rng, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    t = schema.get("type")
    if isinstance(t, list):
        t = rng.choice(t)
    if t is None:
        t = "object" if "properties" in schema else "array" if "items" in schema or "prefixItems" in schema else \
            "string" if "pattern" in schema else rng.choice(["string", "integer", "boolean", "null"])
    if depth > 6:
        t = {"object": "null", "array": "null"}.get(t, t)
    if t == "null":
        return None
    if t == "boolean":
        return rng.random() < 0.5
    if t == "integer":
        return rng.choice([0, 1, 3, 5, 9, 10, 15, 42, 100, 999, -1, -5, 600000, 1000])
    if t == "number":
        return rng.choice([0, 1, 2.5, 0.07, 3, 0.3, 42, -1.25, 999.99, 0.5])
    if t == "string":
        return rng.choice(STRINGS)
    if t == "array":
        prefix = schema.get("prefixItems", schema["items"] if isinstance(schema.get("items"), list) else [])
        rest = schema.get("items") if "prefixItems" in schema else schema.get("additionalItems") if prefix else schema.get("items", {})
        n = rng.randint(schema.get("minItems", 0), min(schema.get("maxItems", 4), 4))
        out = []
        for i in range(n):
            sub = prefix[i] if i < len(prefix) else rest
            if sub is None:
                sub = {}
            out.append(candidate(sub, root, rng, depth + 1))
        return out
    props = schema.get("properties", {})
    keys = [k for k in props if k in schema.get("required", []) or rng.random() < 0.5]
    rng.shuffle(keys)
    out = {k: candidate(props[k], root, rng, depth + 1) for k in keys}
    add = schema.get("additionalProperties")
    if isinstance(add, dict) and rng.random() < 0.5:
        for k in rng.sample(["k1", "zz", "A_1", "ab", "b"], rng.randint(1, 2)):
            if k not in props:
                out[k] = candidate(add, root, rng, depth + 1)
    return out


def main():
    drive, model, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    corpus = []
    files = sys.argv[4:] or sorted(glob.glob(os.path.join(HERE, "corpus", "*.json")))
    for path in files:
        corpus.extend(json.load(open(path, encoding="utf-8")))
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        sp = os.path.join(tmp, "schemas.json")
        json.dump(corpus, open(sp, "w"))
        proc = subprocess.run([drive, model, sp, str(runs), "26", "relaxed"], capture_output=True, text=True)
        lines = [json.loads(l) for l in proc.stdout.split("\n") if l.strip()]
        if len(lines) != len(corpus) * runs:
            failures.append("expected %d generations, got %d (rc %d): %s" %
                            (len(corpus) * runs, len(lines), proc.returncode, proc.stderr[-500:]))
        by_name = {c["name"]: c["schema"] for c in corpus}
        relaxed_by_name = {}
        unvalidated = set()  # relaxed to "any value": the generation parses, nothing more is checked
        validated = 0
        for line in lines:
            name = line["name"]
            if not line.get("ok"):
                failures.append("%s: refused or failed: %s" % (name, line.get("error")))
                continue
            relaxed_by_name[name] = line["relaxations"]
            text = line["text"]
            if outside_ws(text):
                failures.append("%s: not compact: %r" % (name, text))
            value = json.loads(text)
            schema = relaxed_schema(by_name[name], line["relaxations"])
            if schema is None:
                unvalidated.add(name)
            else:
                validated += 1
                errs = list(validator(schema).iter_errors(value))
                if errs:
                    failures.append("%s: %r fails the relaxed schema: %s" % (name, text, errs[0].message))
        # 2. superset: candidates valid under the original are accepted.
        rng = random.Random(26)
        cases, checked = [], 0
        unreadable = []  # a pattern Python's re cannot read (\p{..}): validity unknown, no candidates
        for c in corpus:
            v = validator(c["schema"], K3_FORMATS)
            texts = []
            for _ in range(300):
                inst = candidate(c["schema"], c["schema"], rng)
                try:
                    valid = v.is_valid(inst)
                except re.error:
                    unreadable.append(c["name"])  # validity is unknown here
                    break
                if valid:
                    texts.append(json.dumps(inst, separators=(",", ":"), ensure_ascii=False))
            texts = sorted(set(texts))[:40]
            cases.append({"name": c["name"], "schema": c["schema"], "texts": texts})
        ap = os.path.join(tmp, "accept.json")
        json.dump(cases, open(ap, "w"))
        proc = subprocess.run([drive, "--accept", ap], capture_output=True, text=True)
        results = [json.loads(l) for l in proc.stdout.split("\n") if l.strip()]
        if len(results) != len(cases):
            failures.append("--accept answered %d of %d: %s" % (len(results), len(cases), proc.stderr[-500:]))
        with_valid = 0
        without = []
        for case, res in zip(cases, results):
            if "error" in res:
                failures.append("%s: --accept: %s" % (case["name"], res["error"]))
                continue
            with_valid += bool(case["texts"])
            if not case["texts"] and case["name"] not in unreadable:
                without.append(case["name"])
            for text, ok in zip(case["texts"], res["accepted"]):
                checked += 1
                if not ok:
                    failures.append("%s: %s is valid under the original schema but refused" % (case["name"], text))
    for c in corpus:
        notes = relaxed_by_name.get(c["name"], [])
        print("%-50s %s" % (c["name"], "; ".join("%s at %s" % (r["keyword"], r["pointer"]) for r in notes) or "enforced as written"))
    print("corpus: %d schemas, %d of %d generations validated, %d valid instances accepted (%d schemas with some)" %
          (len(corpus), validated, len(lines), checked, with_valid))
    # What the two checks could not check, by name, each under a cap a little
    # above today's count, so a change that widens a gap fails here:
    # - generations relaxed to any value (a "schema", allOf, $ref or
    #   properties relaxation): only parsed and compact, not validated;
    # - schemas with a pattern Python's re cannot read: no superset check;
    # - schemas none of whose 300 random candidates is valid (the candidate
    #   generator does not know their keywords): no superset check either.
    gaps = [("generations relaxed to any value, not validated", sorted(unvalidated), MAX_UNVALIDATED),
            ("schemas with a pattern Python cannot read, no superset check", sorted(set(unreadable)), MAX_UNREADABLE),
            ("schemas without a valid candidate, no superset check", sorted(without), MAX_WITHOUT_CANDIDATES)]
    for what, names, cap in gaps:
        print("%s: %d (cap %d)%s" % (what, len(names), cap, "".join("\n  " + n for n in names)))
        if len(names) > cap:
            failures.append("%s: %d, over the cap of %d" % (what, len(names), cap))
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

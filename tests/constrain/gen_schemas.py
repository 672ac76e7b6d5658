#!/usr/bin/python3
"""Writes tests/constrain/schemas.json: the schemas of the constrained-decoding
property test (tests/constrain/property_test.sh).

Two parts: hand-written tool and structured-output schemas shaped like the ones
agents send (function calling, response_format), and seeded random schemas that
cover every supported keyword in varied nestings. Regenerate with
    /usr/bin/python3 tests/constrain/gen_schemas.py > tests/constrain/schemas.json
(the output is deterministic; the test reads the committed file).
"""
import json
import random

HAND = [
    {"type": "object", "properties": {"location": {"type": "string", "description": "City and country"},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
     "required": ["location"], "additionalProperties": False},
    {"type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 64},
                                      "top_k": {"type": "integer", "minimum": 1, "maximum": 20}},
     "required": ["query"]},
    {"type": "object", "properties": {"path": {"type": "string"}, "old_str": {"type": "string"},
                                      "new_str": {"type": "string"}},
     "required": ["path", "old_str", "new_str"], "additionalProperties": False},
    {"type": "object", "properties": {"command": {"type": "string"},
                                      "timeout_ms": {"type": "integer", "minimum": 0, "maximum": 600000},
                                      "background": {"type": "boolean"}},
     "required": ["command"]},
    {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "start": {"type": "string", "format": "date-time"},
        "attendees": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 4},
        "reminder_minutes": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 1440}, {"type": "null"}]}},
     "required": ["title", "start"], "additionalProperties": False},
    {"$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 12},
                                                         "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                                                         "price": {"type": "number", "minimum": 0, "maximum": 10000}},
                        "required": ["sku", "qty"], "additionalProperties": False}},
     "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"},
                                                "minItems": 1, "maxItems": 3},
                                      "coupon": {"type": ["string", "null"]}},
     "required": ["items"]},
    {"type": "object", "properties": {"sentiment": {"enum": ["positive", "neutral", "negative"]},
                                      "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["sentiment", "confidence"], "additionalProperties": False},
    {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "object", "properties": {
        "explanation": {"type": "string"}, "output": {"type": "string"}},
        "required": ["explanation", "output"], "additionalProperties": False}, "maxItems": 3},
        "final_answer": {"type": "string"}}, "required": ["steps", "final_answer"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                      "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
     "required": ["name"]},
    {"type": "object", "properties": {"url": {"type": "string", "format": "uri"},
                                      "method": {"enum": ["GET", "POST", "PUT", "DELETE"]},
                                      "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                                      "body": {"type": ["string", "null"]}},
     "required": ["url", "method"]},
    {"type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
                                      "recursive": {"type": "boolean", "default": False}}, "required": ["files"]},
    {"type": "object", "properties": {"sql": {"type": "string"}, "params": {"type": "array", "items": {
        "type": ["string", "number", "boolean", "null"]}, "maxItems": 4}}, "required": ["sql"]},
    {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                      "lon": {"type": "number", "minimum": -180, "maximum": 180}},
     "required": ["lat", "lon"], "additionalProperties": False},
    {"type": "object", "properties": {"todos": {"type": "array", "items": {"type": "object", "properties": {
        "id": {"type": "string"}, "content": {"type": "string", "minLength": 1},
        "status": {"enum": ["pending", "in_progress", "completed"]},
        "priority": {"enum": ["high", "medium", "low"]}}, "required": ["id", "content", "status"],
        "additionalProperties": False}, "maxItems": 3}}, "required": ["todos"], "additionalProperties": False},
    {"type": "object", "properties": {"pattern": {"type": "string"}, "glob": {"type": "string"},
                                      "-i": {"type": "boolean"}, "head_limit": {"type": "integer", "minimum": 1}},
     "required": ["pattern"]},
    {"type": "object", "properties": {"translation": {"type": "string"},
                                      "language": {"const": "fr"}}, "required": ["translation", "language"]},
    {"type": "object", "properties": {"answer": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 10}]}},
     "required": ["answer"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "items": {"type": "array", "items": {
        "type": "integer", "minimum": -9, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}},
     "required": ["matrix"]},
    {"type": "object", "properties": {"日本語": {"type": "string", "maxLength": 5}, "emoji 😀": {"type": "boolean"},
                                      "quote\"key": {"type": "null"}, "back\\slash": {"type": "integer"}},
     "required": ["日本語", "quote\"key"]},
    {"type": "object", "properties": {"meta": {"type": "object"}, "list": {"type": "array", "maxItems": 2}},
     "required": ["meta"]},
    {"type": "object", "properties": {"version": {"enum": [1, 2, 3, 10, 12]}, "flag": {"enum": [True, False, None]}},
     "required": ["version", "flag"]},
    {"definitions": {"color": {"enum": ["red", "green", "blue"]}},
     "type": "object", "properties": {"fg": {"$ref": "#/definitions/color"}, "bg": {"$ref": "#/definitions/color"},
                                      "alpha": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
     "required": ["fg"]},
    {"type": "object", "properties": {"code": {"type": "string", "minLength": 10}}, "required": ["code"]},
    {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 3},
                                                                 "v": {"type": "number"}},
                                "required": ["k", "v"], "additionalProperties": False}, "maxItems": 3},
    {"type": "string", "maxLength": 20},
    {"type": "integer", "minimum": 100, "maximum": 999},
    {"anyOf": [{"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"]}, {"type": "null"}]},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "object", "properties": {"d": {"type": "array", "items": {"type": "object", "properties": {
            "e": {"type": "string", "maxLength": 4}}, "required": ["e"]}, "minItems": 1, "maxItems": 2}},
              "required": ["d"]}}, "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    {"type": "object", "properties": {"score": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 3},
                                      "ratio": {"type": "number", "minimum": 0.25, "maximum": 0.75}},
     "required": ["score", "ratio"]},
    {"type": "object"},
    # Unions whose alternatives start alike (followed in parallel).
    {"type": "object", "properties": {"shape": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0, "maximum": 10}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "integer", "minimum": 1, "maximum": 9},
                                          "h": {"type": "integer", "minimum": 1, "maximum": 9}},
         "required": ["kind", "w", "h"], "additionalProperties": False}]}}, "required": ["shape"]},
    {"$defs": {"Cat": {"type": "object", "properties": {"meows": {"type": "integer"}, "name": {"type": "string", "maxLength": 8}},
                       "required": ["meows"], "additionalProperties": False},
               "Dog": {"type": "object", "properties": {"barks": {"type": "number"}, "name": {"type": "string", "maxLength": 8}},
                       "required": ["barks"], "additionalProperties": False}},
     "type": "object", "properties": {"pet": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"type": "null"}]}},
     "required": ["pet"]},
    {"type": "object", "properties": {"unit": {"anyOf": [{"enum": ["celsius", "fahrenheit"]}, {"type": "string", "maxLength": 3}]},
                                      "value": {"anyOf": [{"type": "integer", "minimum": 100, "maximum": 200},
                                                          {"type": "number", "minimum": -1, "maximum": 1}]}},
     "required": ["unit", "value"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["bug", "feature", "docs", "ci", 1, 12]},
                                               "uniqueItems": True, "minItems": 1}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"filters": {"type": "object", "properties": {
        "owner": {"type": "string", "maxLength": 8}, "state": {"enum": ["open", "closed"]},
        "since": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
        "required": ["limit"], "minProperties": 2, "maxProperties": 3, "additionalProperties": False},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4},
                   "minProperties": 1, "maxProperties": 2}},
     "required": ["filters", "labels"]},
    {"type": "array", "maxItems": 4, "items": {"anyOf": [
        {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
        {"type": "array", "items": {"type": "string", "maxLength": 2}, "minItems": 1, "maxItems": 2}]}},
    # Free keys beside declared ones (additionalProperties as a schema).
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
                                      "priority": {"type": "integer", "minimum": 1, "maximum": 5}},
     "required": ["title"], "additionalProperties": {"type": "string", "maxLength": 12}, "maxProperties": 4},
    {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
     "additionalProperties": {"type": ["number", "boolean"]}, "minProperties": 1},
    # enum / const beside other keywords (the values that fail them are dropped).
    {"type": "object", "properties": {"level": {"type": "integer", "enum": [0, 1, 2, 3, 10, 99], "minimum": 1, "maximum": 10},
                                      "mode": {"type": "string", "enum": ["a", "fast", "thorough", "x"], "minLength": 2},
                                      "flag": {"const": True, "type": "boolean", "description": "always set"}},
     "required": ["level", "mode"], "additionalProperties": False},
    # Recursive $ref (unrolled): a tree through $defs, through "#", and mutual recursion.
    {"$defs": {"node": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                         "children": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                      "maxItems": 2}},
                        "required": ["name"], "additionalProperties": False}},
     "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"]},
    {"type": "object", "properties": {"op": {"enum": ["and", "or", "eq"]}, "field": {"type": "string", "maxLength": 10},
                                      "args": {"type": "array", "items": {"$ref": "#"}, "maxItems": 3}},
     "required": ["op"], "additionalProperties": False},
    {"$defs": {"filter": {"anyOf": [{"$ref": "#/$defs/cond"},
                                    {"type": "object", "properties": {"all": {"type": "array", "items": {"$ref": "#/$defs/filter"},
                                                                              "minItems": 1, "maxItems": 2}},
                                     "required": ["all"], "additionalProperties": False}]},
               "cond": {"type": "object", "properties": {"key": {"type": "string", "maxLength": 10},
                                                         "value": {"type": ["string", "number"]}},
                        "required": ["key", "value"], "additionalProperties": False}},
     "type": "object", "properties": {"filter": {"$ref": "#/$defs/filter"}}, "required": ["filter"],
     "additionalProperties": False},
]

# `pattern` strings (dates, ids, codes, as real tool schemas use them) and
# integer bounds beyond +-1e15; appended after the random part so that the
# schemas above keep their names.
PATTERN = [
    {"type": "object", "properties": {"date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"}},
     "required": ["date"]},
    {"type": "object", "properties": {"at": {"type": "string", "pattern":
        "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])T([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\dZ$"},
        "note": {"type": "string", "maxLength": 20}}, "required": ["at"], "additionalProperties": False},
    {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$"},
                                      "country": {"enum": ["US", "PR"]}}, "required": ["zip", "country"]},
    {"type": "object", "properties": {"user_id": {"type": "string", "pattern": "^usr_[A-Za-z0-9]{8,12}$"}},
     "required": ["user_id"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"type": "string", "pattern": "^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"}},
     "required": ["color"]},
    {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[\\w.+-]+@[\\w-]+\\.[a-z]{2,}$",
                                                "maxLength": 40}}, "required": ["email"]},
    {"type": "object", "properties": {"title": {"type": "string", "pattern": "TODO", "maxLength": 30},
                                      "done": {"type": "boolean"}}, "required": ["title", "done"]},
    {"type": "object", "properties": {"version": {"type": "string", "pattern":
        "^(0|[1-9]\\d*)\\.(0|[1-9]\\d*)\\.(0|[1-9]\\d*)(-[0-9A-Za-z.-]+)?$", "maxLength": 24}},
     "required": ["version"]},
    {"type": "object", "properties": {"phone": {"type": "string", "pattern": "^\\+[1-9]\\d{1,14}$"},
                                      "slug": {"type": "string", "pattern": "^[a-z0-9]+(?:-[a-z0-9]+)*$",
                                               "minLength": 3, "maxLength": 20}},
     "required": ["phone", "slug"], "additionalProperties": False},
    {"type": "object", "properties": {"word": {"type": "string", "pattern": "^(é|ü|你好|\\u00df)+$", "maxLength": 8},
                                      "plain": {"type": "string", "pattern": "^[^\"\\\\]*$", "maxLength": 16},
                                      "path": {"type": "string", "pattern": "^C:\\\\[A-Za-z]+\\.txt$"}},
     "required": ["word", "plain", "path"]},
    {"type": "object", "properties": {"codes": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                                "minItems": 1, "maxItems": 4}}, "required": ["codes"]},
    {"type": "object", "properties": {"amount": {"anyOf": [{"type": "string", "pattern": "^\\d+(\\.\\d\\d)?$",
                                                            "maxLength": 9}, {"type": "integer"}]}},
     "required": ["amount"]},
    {"type": "object", "properties": {"shade": {"type": "string", "enum": ["red", "green", "Blue", "blue"],
                                                "pattern": "^[a-z]+$"}}, "required": ["shade"]},
    {"type": "object", "properties": {"big": {"type": "integer", "minimum": 10000000000000000},
                                      "cap": {"type": "integer", "maximum": 10000000000000000},
                                      "safe": {"type": "integer", "minimum": -9007199254740991,
                                               "maximum": 9007199254740991},
                                      "ratio": {"type": "number", "maximum": 1e16, "exclusiveMinimum": 0}},
     "required": ["big", "cap", "safe", "ratio"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"default": "hello", "description": "A string", "maxLength": 100,
                                               "minLength": 1, "pattern": "^[a-z]+$", "type": "string"}},
     "required": ["name"]},
    {"$defs": {"code": {"type": "string", "pattern": "^[A-Z]{2}\\d{2}$"}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/code"}, "to": {"$ref": "#/$defs/code"},
                                      "via": {"type": "array", "items": {"$ref": "#/$defs/code"}, "maxItems": 2}},
     "required": ["from", "to"]},
]


def rand_key(r):
    pools = ["id", "name", "value", "count", "items", "type", "data", "x", "y", "label", "city", "url",
             "user_id", "createdAt", "é", "ключ", "键", "a b", "q\"t", "s/l", "tab\t"]
    return r.choice(pools) + ("" if r.random() < 0.6 else str(r.randrange(100)))


def rand_schema(r, depth, force=None):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    if depth < 4:
        kinds += ["object", "object", "array", "array", "anyOf", "typelist", "any"]
    k = force or r.choice(kinds)
    if k == "string":
        s = {"type": "string"}
        if r.random() < 0.5:
            s["maxLength"] = r.randrange(0, 24)
            if r.random() < 0.5:
                s["minLength"] = r.randrange(0, s["maxLength"] + 1)
        elif r.random() < 0.3:
            s["minLength"] = r.randrange(1, 8)
        if r.random() < 0.2:
            s["format"] = r.choice(["uri", "date", "email"])
        return s
    if k in ("integer", "number"):
        s = {"type": k}
        if r.random() < 0.6:
            lo = r.randrange(-1000, 1000) / (1 if k == "integer" else r.choice([1, 4, 10, 100]))
            hi = lo + r.randrange(1, 2000) / (1 if k == "integer" else r.choice([1, 2, 8]))
            if r.random() < 0.8:
                s["exclusiveMinimum" if r.random() < 0.3 else "minimum"] = lo
            if r.random() < 0.8:
                s["exclusiveMaximum" if r.random() < 0.3 else "maximum"] = hi
        return s
    if k in ("boolean", "null"):
        return {"type": k}
    if k == "enum":
        pool = ["a", "b", "ab", "abc", "日本", "x y", 0, 1, 12, 123, -5, 2.5, True, False, None, {"k": 1}, [1, "z"]]
        vals = r.sample(pool, r.randrange(1, 6))
        return {"enum": vals}
    if k == "const":
        return {"const": r.choice(["fixed", 7, True, None, "with \"quotes\""])}
    if k == "object":
        n = r.randrange(0, 6)
        props = {}
        for _ in range(n):
            props[rand_key(r)] = rand_schema(r, depth + 1)
        s = {"type": "object", "properties": props}
        keys = list(props)
        req = [key for key in keys if r.random() < 0.6]
        if req:
            s["required"] = req
        if r.random() < 0.5:
            s["additionalProperties"] = False
        if not props and r.random() < 0.5:
            s["additionalProperties"] = rand_schema(r, depth + 1)
        return s
    if k == "array":
        s = {"type": "array", "items": rand_schema(r, depth + 1)}
        if r.random() < 0.7:
            s["maxItems"] = r.randrange(0, 5)
            if r.random() < 0.5:
                s["minItems"] = r.randrange(0, s["maxItems"] + 1)
        return s
    if k == "anyOf":
        # Alternatives that start differently (k3's rule): one per family.
        # anyOf may repeat a family (alternatives that start alike); oneOf may not.
        kw = r.choice(["anyOf", "oneOf"])
        families = ["object", "array", "string", "number", "null", "boolean"]
        n = r.randrange(2, 4)
        fams = r.sample(families, n) if kw == "oneOf" else [r.choice(families) for _ in range(n)]
        alts = []
        for f in fams:
            if f == "number":
                alts.append(rand_schema(r, depth + 1, r.choice(["integer", "number"])))
            elif f in ("object", "array"):
                alts.append(rand_schema(r, depth + 1, f))
            elif f == "string":
                alts.append(r.choice([{"type": "string", "maxLength": r.randrange(1, 10)},
                                      {"enum": r.sample(["a", "ab", "abc", "b", "日本"], 2)}]))
            else:
                alts.append({"type": f})
        return {kw: alts}
    if k == "typelist":
        return {"type": r.sample(["string", "integer", "boolean", "null", "array", "object"], r.randrange(2, 4))}
    return {}


def main():
    r = random.Random(16)
    schemas = [{"name": f"hand-{i}", "schema": s} for i, s in enumerate(HAND)]
    i = 0
    while len(schemas) < 250:
        s = rand_schema(r, 0)
        if s.get("type") != "object" and r.random() < 0.7:
            continue  # mostly objects, as tool arguments are
        schemas.append({"name": f"random-{i}", "schema": s})
        i += 1
    schemas += [{"name": f"pattern-{i}", "schema": s} for i, s in enumerate(PATTERN)]
    schemas.append({"name": "json_object", "schema": None})  # response_format json_object
    print(json.dumps(schemas, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Checker half of the constrained-decoding property test: every output that
constrain_drive produced must (1) be valid UTF-8, (2) parse as strict JSON,
(3) be compact (no whitespace outside strings), and (4) validate against its
schema with python3-jsonschema (Debian's package, an implementation independent
of k3). json_object runs must give an object. Exits 1 listing every failure.

    check_outputs.py SCHEMAS_JSON OUTPUTS_JSONL MIN_RUNS [compact|python]

python: instead of compact, the separators must be exactly Python json.dumps's
(", " and ": ", no other whitespace outside strings).
"""
import json
import sys

import jsonschema


def outside_strings(text):
    """(index, char) of every character outside JSON strings (quotes included)."""
    in_str = esc = False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
                yield i, ch
        else:
            if ch == '"':
                in_str = True
            yield i, ch


def compact(text):
    return not any(ch in " \t\r\n" for _, ch in outside_strings(text))


def python_spaced(text):
    """Separators exactly as Python's json.dumps writes them: ", " and ": "."""
    prev = ""
    for _, ch in outside_strings(text):
        if ch in "\t\r\n" or (ch == " ") != (prev in (",", ":")):
            return False
        prev = ch
    return True


def main():
    schemas_path, outputs_path, min_runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "compact"
    schemas = {e["name"]: e["schema"] for e in json.load(open(schemas_path, encoding="utf-8"))}
    failures, checked, seen = [], 0, set()
    with open(outputs_path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                failures.append(f"line {n}: not a UTF-8 JSON line: {e}")
                continue
            name = rec["name"]
            seen.add(name)
            if not rec["ok"]:
                failures.append(f"{name} run {rec['run']}: generator failed: {rec['error']}")
                continue
            text = rec["text"]
            try:
                value = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
            except ValueError as e:
                failures.append(f"{name} run {rec['run']}: does not parse ({e}): {text!r}")
                continue
            if mode == "python":
                if not python_spaced(text):
                    failures.append(f"{name} run {rec['run']}: separators are not json.dumps's: {text!r}")
            elif not compact(text) or "\n" in text or "\t" in text:
                failures.append(f"{name} run {rec['run']}: not compact: {text!r}")
            schema = schemas[name]
            if schema is None:
                if not isinstance(value, dict):
                    failures.append(f"{name} run {rec['run']}: json_object output is not an object: {text!r}")
            else:
                cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
                errors = sorted(cls(schema).iter_errors(value), key=str)
                if errors:
                    failures.append(f"{name} run {rec['run']}: does not validate: {errors[0].message}: {text!r}")
            checked += 1
    missing = set(schemas) - seen
    if missing:
        failures.append(f"no output for {len(missing)} schemas, e.g. {sorted(missing)[:3]}")
    if checked < min_runs:
        failures.append(f"only {checked} outputs checked, expected at least {min_runs}")
    for fl in failures:
        print("FAIL:", fl)
    print(f"check_outputs: {checked} outputs of {len(seen)} schemas checked, {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

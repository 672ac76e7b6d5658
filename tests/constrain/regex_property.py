#!/usr/bin/python3
"""Property test of k3's `pattern` automaton against Python's re (what
python-jsonschema runs): for each pattern, seeded random strings (drawn from
the pattern's own characters plus a few others, and one-character mutations of
hand-written matches) are spelled as JSON strings with random escapes (\\uXXXX,
surrogate pairs, \\n, \\/, ...), and constrain_drive --match says whether
{"type":"string","pattern":P} accepts each as a whole value.

  * printable-ASCII strings (plus tab and LF): k3 must agree with re.search
    exactly (with a final $ read as \\Z: Python's $ also matches before a
    trailing newline, ECMA-262's does not);
  * strings with other characters: whatever k3 accepts, re must accept (k3's
    shorthand classes, negations and the dot are the part ECMA-262 and Python
    agree on, docs/constrain.md, so k3 may refuse more but never less).

Each pattern must see both accepted and refused strings, so the test can fail
either way.     regex_property.py CONSTRAIN_DRIVE
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

# (pattern, strings that match it: seeds for mutations)
PATTERNS = [
    (r"^[a-z]+$", ["abc", "z"]),
    (r"ab", ["ab", "xaby"]),
    (r"^ab", ["ab", "abz"]),
    (r"ab$", ["ab", "zab"]),
    (r"^a$|^b$|c", ["a", "b", "xcx"]),
    (r"^(?:ab|cd)+$", ["abcd", "cdab"]),
    (r"^\d{4}-\d{2}-\d{2}$", ["2026-12-01"]),
    (r"^\d{5}(-\d{4})?$", ["12345", "12345-6789"]),
    (r"^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$", ["#fff", "#A0b1C2"]),
    (r"^[\w.+-]+@[\w-]+\.[a-z]{2,}$", ["a.b+c@x-y.com"]),
    (r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$", ["1.2.3", "0.10.0-rc.1"]),
    (r"^\+[1-9]\d{1,14}$", ["+14155550100"]),
    (r"^[a-z0-9]+(?:-[a-z0-9]+)*$", ["a-b-c", "x1"]),
    (r"^a{2,3}$", ["aa", "aaa"]),
    (r"^(ab){2}c?$", ["abab", "ababc"]),
    (r"^x?y*z+?$", ["z", "xyyz"]),
    (r"^[^0-9]{2}$", ["ab", "é!"]),
    (r"^\D\W\S$", ["a!b"]),
    (r"^\s*\S+\s*$", [" a ", "ab"]),
    (r"^.{2}$", ["ab", "é\t"]),
    (r"^[\t\x41\u0042-]+$", ["AB-", "\tA"]),
    (r"^a\.b$", ["a.b"]),
    (r'^"[^"\\]*"$', ['"x"', '""']),
    (r"^\\\\?[a-z]$", ["\\a", "\\\\b"]),
    (r"^/\w+/$", ["/ab/"]),
    (r"^(é|ü|你好)+$", ["é", "你好ü"]),
    (r"^[α-ω]{2}$", ["αβ"]),
    (r"^\u00e9+$", ["éé"]),
    ("^\U0001F600.$", ["\U0001F600a"]),
    (r"TODO", ["a TODO b"]),
    (r"^$", [""]),
    (r"^(a|bc)*d$", ["d", "abcad"]),
]

EXTRA = "aZ09 -._\"\\/\t\néü你😀"
ASCII = set(chr(c) for c in range(0x20, 0x7F)) | {"\t", "\n"}


def python_pattern(p):
    # Python's $ also matches before a final newline; \Z is ECMA's $.
    out = re.sub(r"(?<!\\)\$(?=\||$)", r"\\Z", p)
    return out


def spell(s, r):
    """s as a JSON string text, each character spelled raw or escaped at random."""
    out = ['"']
    for ch in s:
        c = ord(ch)
        short = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}
        k = r.random()
        if c >= 0x10000 and k < 0.4:
            v = c - 0x10000
            out.append("\\u%04x\\u%04X" % (0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)))
        elif k < 0.25:
            out.append("\\u%04x" % c if c < 0x10000 else ch)
        elif ch in short:
            out.append(short[ch])
        elif c < 0x20:
            out.append("\\u%04x" % c)
        elif ch == "/" and k < 0.5:
            out.append("\\/")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def candidates(pattern, seeds, r):
    alphabet = sorted(set(ch for ch in pattern if ch not in "^$()[]{}|?*+\\") | set(EXTRA) | set("".join(seeds)))
    strings = set(seeds)
    for _ in range(150):
        strings.add("".join(r.choice(alphabet) for _ in range(r.randrange(0, 9))))
    for s in seeds:
        for _ in range(30):
            t = list(s)
            op = r.randrange(3)
            i = r.randrange(len(t) + 1)
            if op == 0:
                t.insert(i, r.choice(alphabet))
            elif t and op == 1:
                del t[min(i, len(t) - 1)]
            elif t:
                t[min(i, len(t) - 1)] = r.choice(alphabet)
            strings.add("".join(t))
            strings.add(s + "\n")
    return sorted(strings)


def main():
    drive = sys.argv[1]
    r = random.Random(16)
    cases = []
    for pattern, seeds in PATTERNS:
        for s in seeds:
            assert re.search(python_pattern(pattern), s), (pattern, s)
        strings = candidates(pattern, seeds, r)
        cases.append({"pattern": pattern, "strings": strings, "texts": [spell(s, r) for s in strings]})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{"pattern": c["pattern"], "texts": c["texts"]} for c in cases], f, ensure_ascii=False)
        path = f.name
    try:
        out = subprocess.run([drive, "--match", path], capture_output=True, text=True, check=True).stdout.splitlines()
    finally:
        os.unlink(path)
    if len(out) != len(cases):
        print(f"FAIL: {len(out)} result lines for {len(cases)} patterns")
        return 1
    failures = 0
    checked = 0
    for case, line in zip(cases, out):
        res = json.loads(line)
        if "error" in res:
            print(f"FAIL: {case['pattern']!r} does not compile: {res['error']}")
            failures += 1
            continue
        rx = re.compile(python_pattern(case["pattern"]))
        seen = set()
        for s, text, ours in zip(case["strings"], case["texts"], res["accepted"]):
            want = rx.search(s) is not None
            seen.add(ours)
            checked += 1
            if set(s) <= ASCII:
                if ours != want:
                    print(f"FAIL: {case['pattern']!r} on {s!r} (spelled {text}): k3 {ours}, re {want}")
                    failures += 1
            elif ours and not want:
                print(f"FAIL: {case['pattern']!r} on {s!r} (spelled {text}): k3 accepts, re refuses")
                failures += 1
        if seen != {True, False}:
            print(f"FAIL: {case['pattern']!r}: the strings were all {'accepted' if True in seen else 'refused'}")
            failures += 1
    print(f"regex_property: {len(cases)} patterns, {checked} strings, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

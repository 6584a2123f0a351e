#!/usr/bin/env python3
"""Reads gitleaks' rule sources (cmd/generate/config/rules/*.go) and writes each rule's own true and
false positive examples as JSON: the corpus Relay's redactor is measured against.

gitleaks keeps its examples as Go expressions: string literals, `utils.GenerateSampleSecrets(id,
secret)` (the secret written in 20-odd config and code forms) and `secrets.NewSecret(regex)` (a
random string of the regex). This evaluates that small part of Go; random parts come from `rstr`
with a fixed seed, so the output is the same on every run. An element it cannot evaluate is left
out and counted.

usage: examples.py GITLEAKS_CHECKOUT > examples.json   (needs `pip install rstr`)
"""

import json
import random
import re
import sys
from pathlib import Path

import rstr

SAMPLES = [
    '{i}Token="{s}"',
    '{i}Token = "{s}"',
    "{i}Token={s}",
    "{i}Token = {s}",
    '{\n    "{i}_token": "{s}"\n}',
    '{"config.ini": "{I}_TOKEN={s}\\nBACKUP_ENABLED=true"}',
    "<{i}Token>\n    {s}\n</{i}Token>",
    "{i}_token: {s}",
    "{i}_token: '{s}'",
    '{i}_token: "{s}"',
    'string {i}Token = "{s}";',
    'var {i}Token string = "{s}"',
    '{i}Token := "{s}"',
    "{i}Token := `{s}`",
    'String {i}Token = "{s}";',
    'var {i}Token = "{s}"',
    '${i}Token .= "{s}"',
    "{i}Token = '{s}'",
    '{i}Token = "{s}"',
    'System.setProperty("{I}_TOKEN", "{s}")',
    '  "{i}Token" => "{s}"',
    '{i}_TOKEN = "{s}"',
    '{i}_TOKEN := "{s}"',
    '{i}_TOKEN ::= "{s}"',
    '{i}_TOKEN :::= "{s}"',
    '{i}_TOKEN ?= "{s}"',
]

CLASSES = {
    "Numeric": "[0-9]{%s}",
    "Hex": "[a-f0-9]{%s}",
    "AlphaNumeric": "[a-z0-9]{%s}",
    "AlphaNumericExtendedShort": "[a-z0-9_-]{%s}",
    "AlphaNumericExtended": "[a-z0-9=_\\-]{%s}",
    "AlphaNumericExtendedLong": "[a-z0-9\\/=_\\+\\-]{%s}",
}


class Unknown(Exception):
    pass


TOKEN = re.compile(
    r'\s+|//[^\n]*|/\*.*?\*/|`[^`]*`|"(?:\\.|[^"\\\n])*"|\.\.\.|:=|[A-Za-z_][A-Za-z0-9_.]*|[0-9]+|.',
    re.S,
)


def tokens(text):
    out = []
    for m in TOKEN.finditer(text):
        t = m.group(0)
        if t.isspace() or t.startswith("//") or t.startswith("/*"):
            if "\n" in t:
                out.append("\n")
            continue
        out.append(t)
    return out


def go_string(literal):
    if literal.startswith("`"):
        return literal[1:-1]
    return json.loads(literal.replace("\\'", "'").replace("\\x60", "\\u0060"))


def sprintf(fmt, args):
    parts = re.split(r"(%[sdv%])", fmt)
    out, args = [], list(args)
    for p in parts:
        if p == "%%":
            out.append("%")
        elif p in ("%s", "%d", "%v"):
            if not args:
                raise Unknown("sprintf")
            out.append(str(args.pop(0)))
        else:
            out.append(p)
    return "".join(out)


GENERATOR = rstr.Rstr(random.Random(0x5EED))


def new_secret(regex):
    try:
        return GENERATOR.xeger(regex)
    except Exception as e:  # a regex Python cannot generate from
        raise Unknown(f"regex {regex}: {e}")


class Parser:
    """A Go expression over strings, at `toks[at]`."""

    def __init__(self, toks, env):
        self.toks, self.at, self.env = toks, 0, env

    def peek(self, skip_lines=True):
        while skip_lines and self.at < len(self.toks) and self.toks[self.at] == "\n":
            self.at += 1
        return self.toks[self.at] if self.at < len(self.toks) else None

    def take(self, want=None):
        t = self.peek()
        if want is not None and t != want:
            raise Unknown(f"expected {want}, found {t}")
        self.at += 1
        return t

    def expr(self):
        value = self.term()
        while self.peek() == "+":
            self.take()
            right = self.term()
            if isinstance(value, list) or isinstance(right, list):
                raise Unknown("list sum")
            value = value + right
        return value

    def args(self):
        self.take("(")
        out = []
        while self.peek() not in (")", None):
            out.append(self.expr())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return out

    def term(self):
        t = self.take()
        if t is None:
            raise Unknown("end")
        if t.startswith('"') or t.startswith("`"):
            return go_string(t)
        if t == "[":
            self.take("]")
            self.take("string")
            return self.elements()
        if t == "utils.GenerateSampleSecrets":
            ident, secret = self.args()
            return [s.replace("{i}", ident).replace("{I}", ident.upper()).replace("{s}", secret) for s in SAMPLES]
        if t == "utils.GenerateSampleSecret":
            ident, secret = self.args()
            return f'{ident}_api_token = "{secret}"'
        if t == "secrets.NewSecret":
            (regex,) = self.args()
            return new_secret(regex)
        if t == "utils.Hex8_4_4_4_12":
            self.args()
            return "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        if t.startswith("utils.") and t[6:] in CLASSES:
            (size,) = self.args()
            return CLASSES[t[6:]] % size
        if t == "fmt.Sprintf":
            fmt, *rest = self.args()
            return sprintf(fmt, rest)
        if t == "strings.Repeat":
            s, n = self.args()
            return s * int(n)
        if t.isdigit():
            return t
        if t in self.env:
            return self.env[t]
        raise Unknown(f"term {t}")

    def elements(self):
        """`{ e, e, ... }`: each element evaluated on its own; those that cannot be are counted."""
        self.take("{")
        out, skipped = [], 0
        while self.peek() not in ("}", None):
            start = self.at
            try:
                value = self.expr()
                if self.peek() == "...":
                    self.take()
                out.extend(value if isinstance(value, list) else [value])
            except Unknown:
                skipped += 1
                self.at = start
                self.skip_element()
            if self.peek() == ",":
                self.take()
        self.take("}")
        Parser.skipped += skipped
        return out

    def skip_element(self):
        depth = 0
        while True:
            t = self.peek()
            if t is None:
                return
            if depth == 0 and t in (",", "}"):
                return
            if t in "({[":
                depth += 1
            elif t in ")}]":
                depth -= 1
            self.take()


Parser.skipped = 0


def functions(source):
    """Each top-level function's body."""
    for m in re.finditer(r"^func [^\n]*\{\n(.*?)^\}", source, re.S | re.M):
        yield m.group(1)


def examples(body):
    rule = re.search(r'RuleID:\s*"([^"]+)"', body)
    if not rule:
        return None
    toks = tokens(body)
    env, found = {}, {"tps": [], "fps": []}
    i = 0
    while i < len(toks):
        t = toks[i]
        if i + 1 < len(toks) and toks[i + 1] in (":=", "=") and (i == 0 or toks[i - 1] == "\n"):
            name, op = t, toks[i + 1]
            p = Parser(toks[i + 2 :], env)
            try:
                if name in ("tps", "fps") and p.peek() == "append":
                    p.take()
                    p.take("(")
                    p.take(name)
                    p.take(",")
                    values = []
                    while p.peek() not in (")", None):
                        start = p.at
                        try:
                            v = p.expr()
                            if p.peek() == "...":
                                p.take()
                            values.extend(v if isinstance(v, list) else [v])
                        except Unknown:
                            Parser.skipped += 1
                            p.at = start
                            p.skip_element()
                        if p.peek() == ",":
                            p.take()
                    found[name].extend(values)
                else:
                    if name in ("tps", "fps") and p.peek() == "map":
                        raise Unknown("examples with paths")
                    value = p.expr()
                    if name in ("tps", "fps"):
                        found[name] = (value if isinstance(value, list) else [value]) if op == ":=" else found[name] + [value]
                    elif isinstance(value, str):
                        env[name] = value
            except Unknown:
                if name in ("tps", "fps"):
                    Parser.skipped += 1
            i += 2 + p.at
            continue
        i += 1
    return {"rule": rule.group(1), "tps": found["tps"], "fps": found["fps"]}


def main():
    root = Path(sys.argv[1])
    out = []
    for path in sorted((root / "cmd/generate/config/rules").glob("*.go")):
        source = path.read_text()
        for body in functions(source):
            found = examples(body)
            if found and (found["tps"] or found["fps"]):
                out.append(found)
    print(f"{len(out)} rules, {sum(len(r['tps']) for r in out)} true and {sum(len(r['fps']) for r in out)} false positives; {Parser.skipped} examples left out", file=sys.stderr)
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Structure rules of src/ (issue 61), checked by tests/tools/test_layout_rules.py.

- no mutual includes inside serve/: module a (a.h, a.cpp) including b while b includes a;
- serve/engine.h has at most 4 includers: the request contract lives in serve/request.h;
- no function in serve/ over 80 lines (a route table and short handlers, not one long setup);
- no string test of a fusion method's name outside the method registry (fusion/methods.cpp):
  callers ask the registry (FusionOptions::full(), is_full_prefill, MethodEntry traits).

Usage: check_layout.py [SRC_DIR]; prints each breach, exits 1 if there is any.
"""
import os
import re
import sys

MAX_ENGINE_INCLUDERS = 4
MAX_SERVE_FUNCTION_LINES = 80
METHOD_NAMES = ("full", "auto", "reuse", "random", "epic", "cacheblend", "prophet", "cachecraft", "qcfuse",
                "fusionrag", "oracle")
REGISTRY = os.path.join("fusion", "methods.cpp")

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
NAME_TEST = re.compile(r'\b(\w*method\w*|base)(\(\))?\s*[!=]=\s*"(%s)"|"(%s)"\s*[!=]=\s*\w*method' %
                       ("|".join(METHOD_NAMES), "|".join(METHOD_NAMES)))
CONTROL = re.compile(r'^\s*(if|for|while|switch|catch|else|do|try|namespace|struct|class|enum|union)\b')
SIGNATURE_END = re.compile(r'\)\s*(const)?\s*(override|final)?\s*(noexcept)?\s*(->\s*[\w:<>&*, ]+)?\s*\{\s*(//.*)?$')


def sources(src):
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith((".h", ".cpp", ".inc")):
                path = os.path.join(root, f)
                yield os.path.relpath(path, src), path


def module_of(rel):
    return os.path.splitext(rel)[0]


def mutual_includes(src):
    deps = {}
    for rel, path in sources(src):
        mod = module_of(rel)
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = INCLUDE.match(line)
                if m and os.path.dirname(m.group(1)) == os.path.dirname(rel):
                    other = module_of(m.group(1))
                    if other != mod:
                        deps.setdefault(mod, set()).add(other)
    pairs = set()
    for a, bs in deps.items():
        for b in bs:
            if a in deps.get(b, ()):
                pairs.add(tuple(sorted((a, b))))
    return sorted(pairs)


def engine_includers(src):
    out = []
    for rel, path in sources(src):
        if rel == os.path.join("serve", "engine.h"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            if any(INCLUDE.match(l) and INCLUDE.match(l).group(1) == "serve/engine.h" for l in f):
                out.append(rel)
    return out


def strip_strings(line):
    return re.sub(r'"(\\.|[^"\\])*"', '""', re.sub(r"'(\\.|[^'\\])*'", "''", line))


def long_functions(path, limit):
    """(first line, length, signature) of each function body longer than `limit` lines."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    out = []
    i = 0
    while i < len(lines):
        code = strip_strings(lines[i].split("//")[0]) if "//" in lines[i] else strip_strings(lines[i])
        if SIGNATURE_END.search(code.rstrip() + "\n") and not CONTROL.match(code) and "](" not in code and "=" not in code.split("(")[0]:
            depth, j = 0, i
            while j < len(lines):
                c = strip_strings(lines[j].split("//")[0])
                depth += c.count("{") - c.count("}")
                if depth <= 0 and j > i or (depth == 0 and j == i and "}" in c):
                    break
                j += 1
            length = j - i + 1
            if length > limit:
                out.append((i + 1, length, lines[i].strip()))
            i = j + 1
            continue
        i += 1
    return out


def method_name_tests(src):
    out = []
    for rel, path in sources(src):
        if rel == REGISTRY:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                code = line.split("//")[0]
                if NAME_TEST.search(code):
                    out.append((rel, n, line.strip()))
    return out


def breaches(src):
    found = []
    for a, b in mutual_includes(src):
        if a.startswith("serve" + os.sep):
            found.append(f"mutual include: {a} <-> {b}")
    includers = engine_includers(src)
    if len(includers) > MAX_ENGINE_INCLUDERS:
        found.append(f"serve/engine.h has {len(includers)} includers (at most {MAX_ENGINE_INCLUDERS}): "
                     + ", ".join(includers))
    for rel, path in sources(src):
        if rel.startswith("serve" + os.sep) and rel.endswith(".cpp"):
            for line, length, sig in long_functions(path, MAX_SERVE_FUNCTION_LINES):
                found.append(f"{rel}:{line}: function of {length} lines (at most {MAX_SERVE_FUNCTION_LINES}): {sig}")
    for rel, n, line in method_name_tests(src):
        found.append(f"{rel}:{n}: method name tested outside the registry: {line}")
    return found


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    found = breaches(src)
    for b in found:
        print(b)
    print(f"{len(found)} breach(es) of the layout rules in {os.path.normpath(src)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

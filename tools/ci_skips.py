#!/usr/bin/env python3
"""CI's skip policy (issue 24): counts the skipped tests of a run and fails on any skip that
tests/skip_allowlist.txt does not allow (by test name and skip reason), printing each skip
with its reason.

  tools/ci_skips.py [--junit FILE]... [--unittest-log FILE]... [--allowlist FILE]

--junit: ctest's --output-junit file (GoogleTest's GTEST_SKIP() reason is read from the
test's output); --unittest-log: the output of `python -m unittest -v` (lines
"test (module.Class.test) ... skipped 'reason'"). Exit 0 when every skip is allowed.
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load_allowlist(path):
    rules = []
    for line in Path(path).read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            sys.exit(f"{path}: want 'name-regex<TAB>reason-regex<TAB>why', got: {line!r}")
        rules.append((re.compile(parts[0]), re.compile(parts[1]), parts[2]))
    return rules


def junit_skips(path):
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("status") != "skipped" and case.find("skipped") is None:
            continue
        text = "".join(e.text or "" for e in case.iter("system-out"))
        m = re.search(r"Skipped\s*\n(.*)", text)
        reason = m.group(1).strip() if m else (case.find("skipped").get("message", "") if case.find("skipped") is not None else "")
        out.append((case.get("name", "?"), reason or "(no reason given)"))
    return out


def unittest_skips(path):
    # "name (module.Class.name) ... skipped 'reason'", or with a docstring the name on the
    # line before "docstring ... skipped 'reason'".
    out, prev = [], ""
    for line in Path(path).read_text(errors="replace").splitlines():
        m = re.search(r"\.\.\. skipped '(.*)'$", line)
        if m:
            n = re.match(r"(\S+) \(([^)]*)\)", line) or re.match(r"(\S+) \(([^)]*)\)", prev)
            out.append((n.group(2) if n else line, m.group(1)))
        prev = line
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--junit", action="append", default=[])
    ap.add_argument("--unittest-log", action="append", default=[])
    ap.add_argument("--allowlist", default=str(REPO / "tests" / "skip_allowlist.txt"))
    a = ap.parse_args()
    rules = load_allowlist(a.allowlist)
    skips = []
    for f in a.junit:
        if not Path(f).is_file():
            print(f"skip check: {f} is missing (did ctest run?)")
            return 1
        skips += [(f, *s) for s in junit_skips(f)]
    for f in a.unittest_log:
        if Path(f).is_file():
            skips += [(f, *s) for s in unittest_skips(f)]
    bad = 0
    for src, name, reason in skips:
        why = next((w for n, r, w in rules if n.search(name) and r.search(reason)), None)
        if why:
            print(f"  skipped (allowed): {name}: {reason} [{why}]")
        else:
            bad += 1
            print(f"  SKIPPED, NOT ALLOWED: {name}: {reason} ({Path(src).name})")
    print(f"skip check: {len(skips)} skipped, {len(skips) - bad} allowed, {bad} not allowed"
          + ("" if not bad else f" (allow-list: {a.allowlist})"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

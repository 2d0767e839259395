"""tools/check_layout.py (issue 61): src/ keeps its structure rules, and each rule catches a
breach planted in a scratch tree. Run by ctest (bench_report_py discovers tests/tools)."""
import os
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import check_layout  # noqa: E402


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


class LayoutRules(unittest.TestCase):
    def test_the_tree_keeps_the_rules(self):
        self.assertEqual(check_layout.breaches(os.path.join(ROOT, "src")), [])

    def test_each_rule_catches_a_planted_breach(self):
        with tempfile.TemporaryDirectory() as src:
            write(src, "serve/a.h", '#include "serve/b.h"\n')
            write(src, "serve/b.cpp", '#include "serve/a.h"\n')
            write(src, "serve/engine.h", "")
            for i in range(5):
                write(src, f"serve/user{i}.cpp", '#include "serve/engine.h"\n')
            body = "".join(f"  x += {i};\n" for i in range(81))
            write(src, "serve/long.cpp", "int f(int x) {\n" + body + "  return x;\n}\n"
                  "int g(int x) {\n  return x;\n}\n")
            write(src, "eval/run.cpp", 'bool f(const Opt& o) { return o.method == "full"; }\n')
            write(src, "fusion/methods.cpp", 'bool f(std::string_view method) { return method == "full"; }\n')
            found = check_layout.breaches(src)
        text = "\n".join(found)
        self.assertIn("mutual include: serve/a <-> serve/b", text)
        self.assertIn("serve/engine.h has 5 includers", text)
        self.assertIn("serve/long.cpp:1: function of 84 lines", text)
        self.assertNotIn("serve/long.cpp:85", text)  # g is short
        self.assertIn("eval/run.cpp:1: method name tested outside the registry", text)
        self.assertNotIn("fusion/methods.cpp", text)  # the registry itself may
        self.assertEqual(len(found), 4, text)


if __name__ == "__main__":
    unittest.main()

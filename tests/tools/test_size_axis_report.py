"""Unit tests of tools/size_axis_report.py's row selection (issue 23, item 6): one chunk
context, the first N examples, and the same examples on every model. Run by ctest
(bench_report_py discovers every test here); the plot itself needs matplotlib and is not
exercised."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import size_axis_report  # noqa: E402


def row(method, ratio, index, fidelity, kl=0.1, context=None):
    r = {"method": method, "ratio": ratio, "example": "ex%d" % index, "example_index": index,
         "fidelity_f1": fidelity, "kl": kl, "first_token_agree": fidelity == 1.0}
    if context:
        r["chunk_context"] = context
    return r


class SizeAxisSelection(unittest.TestCase):
    def test_prefixed_rows_do_not_replace_alone_ones(self):
        rows = [row("full", 1.0, 0, 1.0), row("epic", 0.15, 0, 0.25),
                row("epic", 0.15, 0, 1.0, context="prefixed"), row("reuse", 0.0, 0, 0.5)]
        alone = size_axis_report.rows_by_method(rows, 0.15)
        self.assertEqual(alone["epic"]["ex0"]["fidelity_f1"], 0.25)
        self.assertNotIn("full", alone)
        older = row("cacheblend", 0.15, 0, 0.75)
        older["chunk_variant"] = "prefixed"  # the field's name in results written before issue 25
        rows.append(older)
        alone = size_axis_report.rows_by_method(rows, 0.15)
        self.assertNotIn("cacheblend", alone)
        prefixed = size_axis_report.rows_by_method(rows, 0.15, context="prefixed")
        self.assertEqual(prefixed["cacheblend"]["ex0"]["fidelity_f1"], 0.75)
        self.assertEqual(prefixed["epic"]["ex0"]["fidelity_f1"], 1.0)
        self.assertNotIn("reuse", prefixed)

    def test_other_ratios_and_later_examples_are_left_out(self):
        rows = [row("epic", 0.3, 0, 0.9), row("epic", 0.15, 0, 0.2), row("epic", 0.15, 5, 0.7),
                row("reuse", 0.0, 0, 0.4)]
        by_method = size_axis_report.rows_by_method(rows, 0.15, limit=5)
        self.assertEqual(sorted(by_method["epic"]), ["ex0"])
        self.assertEqual(by_method["epic"]["ex0"]["fidelity_f1"], 0.2)
        self.assertIn("ex0", by_method["reuse"])  # reuse counts at any ratio

    def test_every_model_is_measured_on_the_same_examples(self):
        small = size_axis_report.rows_by_method(
            [row("epic", 0.15, i, 0.5) for i in range(4)] + [row("qcfuse", 0.15, i, 0.5) for i in range(3)], 0.15)
        large = size_axis_report.rows_by_method([row("epic", 0.15, i, 1.0) for i in (1, 2, 3)], 0.15)
        common = size_axis_report.common_examples([small, large])
        self.assertEqual(common, {"ex1", "ex2"})
        table = size_axis_report.model_table(large, common)
        self.assertEqual(table["epic"]["n"], 2)
        self.assertEqual(table["epic"]["first"], [1.0, 1.0])


if __name__ == "__main__":
    unittest.main()

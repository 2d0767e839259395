"""Unit tests of tools/bench_report.py's statistics (hand-checked cases). Run by ctest
(test name bench_report_py) or directly: python3 -m unittest discover -s tests/tools."""
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import bench_report  # noqa: E402


# The fields a report needs beyond the quality ones (aggregate's TTFT columns).
TIMING_FIELDS = {"f1": 0.5, "em": 0.0, "rouge_l": 0.5, "lookup_ms": 0.0, "load_ms": 0.0, "selection_ms": 0.0,
                 "recomputed_tokens": 1, "context_tokens": 10, "decode_tok_s": 10.0}


def row(method, ratio, example, fidelity, kl=0.0, dataset="d"):
    return {"dataset": dataset, "model": "m.gguf", "method": method, "ratio": ratio, "example": example,
            "fidelity_f1": fidelity, "kl": kl}


class QuantileTest(unittest.TestCase):
    def test_linear_interpolation(self):
        # numpy.quantile([1, 2, 3, 4], q): 0.5 -> 2.5, 0.9 -> 3.7, 0 -> 1, 1 -> 4.
        self.assertAlmostEqual(bench_report.quantile([4, 1, 3, 2], 0.5), 2.5)
        self.assertAlmostEqual(bench_report.quantile([1, 2, 3, 4], 0.9), 3.7)
        self.assertEqual(bench_report.quantile([1, 2, 3, 4], 0.0), 1)
        self.assertEqual(bench_report.quantile([1, 2, 3, 4], 1.0), 4)

    def test_empty_is_nan(self):
        self.assertTrue(math.isnan(bench_report.quantile([], 0.5)))


class BootstrapTest(unittest.TestCase):
    def test_constant_series_has_a_point_interval(self):
        (lo, hi), = bench_report.bootstrap_mean_ci([[0.25] * 7])
        self.assertAlmostEqual(lo, 0.25)
        self.assertAlmostEqual(hi, 0.25)

    def test_interval_brackets_the_mean_and_stays_in_the_data_range(self):
        data = [-0.5, 0.0, 0.0, -0.5, 0.2, -0.1]
        (lo, hi), = bench_report.bootstrap_mean_ci([data])
        m = sum(data) / len(data)
        self.assertLessEqual(lo, m)
        self.assertGreaterEqual(hi, m)
        self.assertGreaterEqual(lo, min(data))
        self.assertLessEqual(hi, max(data))
        self.assertLess(lo, hi)

    def test_fixed_seed_gives_the_same_interval(self):
        data = [0.1, -0.3, 0.5, 0.0, 0.2]
        self.assertEqual(bench_report.bootstrap_mean_ci([data]), bench_report.bootstrap_mean_ci([data]))

    def test_series_are_resampled_together(self):
        # The same indices for both series: a series and its negation get mirrored intervals.
        data = [0.1, -0.3, 0.5, 0.0, 0.2]
        (lo1, hi1), (lo2, hi2) = bench_report.bootstrap_mean_ci([data, [-x for x in data]])
        self.assertAlmostEqual(lo1, -hi2)
        self.assertAlmostEqual(hi1, -lo2)


class PairedDifferencesTest(unittest.TestCase):
    def test_best_method_is_the_reference_and_differences_are_paired(self):
        rows = [row("full", 1.0, e, 1.0) for e in "abcd"]
        rows += [row("reuse", 0.0, e, 0.3) for e in "abcd"]
        # A: fidelity 1, 1, 0.5, 0.5 (mean 0.75); B: 0.5, 1, 0.5, 0 (mean 0.5).
        rows += [row("A", 0.15, e, f, kl=0.1) for e, f in zip("abcd", [1, 1, 0.5, 0.5])]
        rows += [row("B", 0.15, e, f, kl=0.3) for e, f in zip("abcd", [0.5, 1, 0.5, 0])]
        # Ratios 0 and 1 are the reuse / full invariants, not a comparison.
        rows += [row("A", 1.0, "a", 1.0), row("B", 1.0, "a", 0.9), row("A", 0.0, "a", 0.3), row("B", 0.0, "a", 0.2)]
        out = bench_report.paired_differences(rows)
        diffs = out[("d", "m.gguf")]
        self.assertEqual(len(diffs), 1)
        d = diffs[0]
        self.assertEqual((d["ratio"], d["best"], d["method"], d["n"]), (0.15, "A", "B", 4))
        self.assertAlmostEqual(d["d_fidelity"], -0.25)  # per example -0.5, 0, 0, -0.5
        self.assertEqual((d["better"], d["worse"]), (0, 2))
        self.assertGreaterEqual(d["d_fidelity_lo"], -0.5)
        self.assertLessEqual(d["d_fidelity_hi"], 0.0)
        # KL differs by exactly +0.2 on every example: a point interval, which excludes 0.
        self.assertAlmostEqual(d["d_kl"], 0.2)
        self.assertAlmostEqual(d["d_kl_lo"], 0.2)
        self.assertAlmostEqual(d["d_kl_hi"], 0.2)
        self.assertTrue(bench_report.fmt_interval(d["d_kl"], d["d_kl_lo"], d["d_kl_hi"]).endswith("*"))

    def test_only_examples_both_methods_ran_are_compared(self):
        # A partial (resumed) run: B has not reached example c yet.
        rows = [row("A", 0.3, "a", 0.8), row("A", 0.3, "b", 0.6), row("A", 0.3, "c", 0.0),
                row("B", 0.3, "a", 0.7), row("B", 0.3, "b", 0.4)]
        d, = bench_report.paired_differences(rows)[("d", "m.gguf")]
        # B's mean (0.55) is above A's (0.467) but over fewer examples: the reference is A, the
        # method that ran the most; over a and b B is below it.
        self.assertEqual((d["best"], d["method"], d["n"]), ("A", "B", 2))
        self.assertAlmostEqual(d["d_fidelity"], -0.15)  # B - A: -0.1 and -0.2
        self.assertEqual((d["better"], d["worse"]), (0, 2))

    def test_auto_rows_are_labelled_and_never_paired_with_selectors(self):
        # auto's ratio slot holds a quality target (0.15 here, the same number as epic's ratio).
        rows = [row("epic", 0.15, e, 0.5) for e in "abc"] + [row("cacheblend", 0.15, e, 0.7) for e in "abc"]
        rows += [row("auto", 0.15, e, 1.0) for e in "abc"]
        diffs = bench_report.paired_differences(rows)[("d", "m.gguf")]
        self.assertEqual([(d["best"], d["method"]) for d in diffs], [("cacheblend", "epic")])
        self.assertIn("auto q", bench_report.method_order(rows))
        self.assertNotIn("auto", bench_report.method_order(rows))
        # A first-token budget in the slot (bench --ttft-budgets): "auto ms", not a quality target.
        budget = row("auto", 300, "a", 1.0)
        budget["ttft_budget_ms"] = 300.0
        self.assertIn("auto ms", bench_report.method_order(rows + [budget]))

    def test_a_single_method_gives_no_comparison(self):
        rows = [row("A", 0.15, "a", 0.5), row("full", 1.0, "a", 1.0)]
        self.assertEqual(bench_report.paired_differences(rows)[("d", "m.gguf")], [])

    def test_interval_format(self):
        self.assertEqual(bench_report.fmt_interval(-0.038, -0.121, 0.037), "-0.038 [-0.121, +0.037]")
        self.assertEqual(bench_report.fmt_interval(0.2, 0.1, 0.3, 2), "+0.20 [+0.10, +0.30]*")


class ChunkContextTest(unittest.TestCase):
    def rows(self):
        rows = [row("full", 1.0, e, 1.0) for e in "abc"]
        for variant, base in (("alone", 0.5), ("prefixed", 0.4)):
            for i, e in enumerate("abc"):
                for method, ratio, fid in (("reuse", 0.0, base), ("epic", 0.0, base), ("fusionrag", 0.0, base + 0.1),
                                           ("epic", 0.15, base + 0.2)):
                    r = row(method, ratio, e, fid + 0.01 * i, kl=1.0 - fid)
                    r["first_token_agree"] = True
                    if variant == "prefixed":
                        # Rows of results.jsonl files written before issue 25 name the field
                        # "chunk_variant"; both spellings must read the same.
                        r["chunk_context" if i % 2 else "chunk_variant"] = "prefixed"
                    rows.append(r)
        return rows

    def test_prefixed_rows_get_their_own_dataset_with_full_shared(self):
        labelled = bench_report.label_chunk_contexts(self.rows())
        pre = [r for r in labelled if r["dataset"] == "d [prefixed]"]
        self.assertEqual(sum(1 for r in pre if r["method"] == "full"), 3)
        self.assertEqual(sum(1 for r in pre if r["method"] == "epic"), 6)
        self.assertEqual(sum(1 for r in labelled if r["dataset"] == "d" and r["method"] == "epic"), 6)

    def test_the_report_header_counts_each_row_of_the_file_once(self):
        rows = [dict(r, first_token_agree=True, ttft_ms=10.0, recompute_ms=10.0, **TIMING_FIELDS)
                for r in self.rows()]  # 3 full rows shared by both contexts, 24 selector rows
        labelled = bench_report.label_chunk_contexts(rows)
        self.assertEqual(len(labelled), len(rows) + 3)  # the full rows are copied to the prefixed label
        with tempfile.TemporaryDirectory() as d:
            bench_report.write_report(d, labelled, bench_report.aggregate(labelled), {})
            with open(os.path.join(d, "report.md"), encoding="utf-8") as f:
                report = f.read()
        self.assertIn(f"Rows: {len(rows)}. ", report)
        self.assertIn(f"Rows timed with kernels: not recorded {len(rows)} ", report)

    def test_the_header_context_length_counts_each_example_once(self):
        # Example a has 100 context tokens, b and c 400 each: the mean over examples is 300. A
        # method run on a alone (as a resumed cell is) must not pull it down: the mean of the
        # table's per-cell means would say (300 + 100) / 2 = 200.
        tokens = {"a": 100, "b": 400, "c": 400}
        rows = [dict(row("full", 1.0, e, 1.0), first_token_agree=True, ttft_ms=10.0, recompute_ms=10.0,
                     **dict(TIMING_FIELDS, context_tokens=tokens[e])) for e in "abc"]
        rows.append(dict(row("epic", 0.15, "a", 0.5), first_token_agree=True, ttft_ms=5.0, recompute_ms=1.0,
                         **dict(TIMING_FIELDS, context_tokens=100)))
        with tempfile.TemporaryDirectory() as d:
            bench_report.write_report(d, rows, bench_report.aggregate(rows), {})
            with open(os.path.join(d, "report.md"), encoding="utf-8") as f:
                report = f.read()
        self.assertIn("## d (m.gguf, 3 examples, 300 context tokens on average)", report)

    def test_prefixed_minus_alone_and_ratio_zero_against_reuse(self):
        diffs = bench_report.paired_more(bench_report.label_chunk_contexts(self.rows()))
        by = {(d["comparison"], d["method"], d["ratio"]): d for d in diffs}
        d = by[("prefixed - alone", "epic", 0.15)]
        self.assertEqual(d["n"], 3)
        self.assertAlmostEqual(d["d_fidelity"], -0.1)
        self.assertAlmostEqual(d["d_kl"], 0.1)
        self.assertEqual((d["better"], d["worse"]), (0, 3))
        f = by[("fusionrag - reuse (prefixed)", "fusionrag", 0.0)]
        self.assertAlmostEqual(f["d_fidelity"], 0.1)
        self.assertAlmostEqual(f["d_kl"], -0.1)
        # epic at ratio 0 is reuse: no line.
        self.assertNotIn(("epic - reuse (alone)", "epic", 0.0), by)
        # Reuse on the other variant only for a --versus method: prefixed fusionrag (0.50/0.51/0.52)
        # against alone reuse (0.50/0.51/0.52).
        self.assertNotIn(("fusionrag (prefixed) - reuse (alone)", "fusionrag", 0.0), by)
        versus = {(d["comparison"], d["method"], d["ratio"]): d for d in
                  bench_report.paired_more(bench_report.label_chunk_contexts(self.rows()), versus=("fusionrag",))}
        g = versus[("fusionrag (prefixed) - reuse (alone)", "fusionrag", 0.0)]
        self.assertAlmostEqual(g["d_fidelity"], 0.0)
        self.assertAlmostEqual(g["d_kl"], 0.0)

    def test_versus_compares_the_named_method_with_every_other_selector_per_variant(self):
        rows = self.rows()
        for variant in ("alone", "prefixed"):
            for i, e in enumerate("abc"):
                r = row("qcfuse", 0.15, e, 0.9 - 0.01 * i, kl=0.05)
                r["first_token_agree"] = True
                if variant == "prefixed":
                    r["chunk_context"] = "prefixed"
                rows.append(r)
        labelled = bench_report.label_chunk_contexts(rows)
        by = {(d["comparison"], d["ratio"]): d for d in bench_report.paired_more(labelled, versus=("qcfuse",))}
        d = by[("qcfuse - epic (alone)", 0.15)]
        self.assertEqual(d["n"], 3)
        self.assertAlmostEqual(d["d_fidelity"], (0.9 - 0.7) - 0.02)  # 0.90/0.89/0.88 vs 0.70/0.71/0.72
        self.assertAlmostEqual(d["d_kl"], 0.05 - 0.3)
        self.assertEqual((d["better"], d["worse"]), (3, 0))
        self.assertIn(("qcfuse - epic (prefixed)", 0.15), by)
        # Across variants too: prefixed qcfuse (0.90/0.89/0.88) against alone epic (0.70/0.71/0.72).
        x = by[("qcfuse (prefixed) - epic (alone)", 0.15)]
        self.assertAlmostEqual(x["d_fidelity"], (0.9 - 0.7) - 0.02)
        self.assertAlmostEqual(x["d_kl"], 0.05 - 0.3)
        self.assertNotIn(("qcfuse (prefixed) - qcfuse (alone)", 0.15), by)  # that is "prefixed - alone"
        # Only ratios strictly inside (0, 1), never against full or reuse, and not without --versus.
        self.assertFalse(any(c.startswith("qcfuse - reuse") or c.startswith("qcfuse - full") for c, _ in by))
        self.assertFalse(any(c.startswith("qcfuse -") for c, _ in
                             {(d["comparison"], d["ratio"]) for d in bench_report.paired_more(labelled)}))

    def test_versus_reuse_pairs_every_selector_with_reuse_on_its_context(self):
        labelled = bench_report.label_chunk_contexts(self.rows())
        by = {(d["comparison"], d["ratio"]): d for d in bench_report.paired_more(labelled, versus=("reuse",))}
        d = by[("epic - reuse (alone)", 0.15)]  # 0.70/0.71/0.72 against 0.50/0.51/0.52
        self.assertEqual(d["n"], 3)
        self.assertAlmostEqual(d["d_fidelity"], 0.2)
        self.assertAlmostEqual(d["d_kl"], -0.2)
        self.assertEqual((d["better"], d["worse"]), (3, 0))
        p = by[("epic - reuse (prefixed)", 0.15)]  # 0.60/0.61/0.62 against prefixed reuse 0.40/0.41/0.42
        self.assertAlmostEqual(p["d_fidelity"], 0.2)
        # Reuse is not compared with itself, nor across contexts, and only with --versus reuse.
        self.assertFalse(any(c.startswith("reuse - reuse") for c, _ in by))
        self.assertNotIn(("epic (prefixed) - reuse (alone)", 0.15), by)
        self.assertNotIn(("epic - reuse (alone)", 0.15),
                         {(d["comparison"], d["ratio"]) for d in bench_report.paired_more(labelled)})

    def test_regenerating_a_report_keeps_the_earlier_reports_machine_line(self):
        # Rows made before the bench recorded its kernels do not say where they ran; the line a
        # report keeps for that must survive the folder's next regeneration, once, in its place.
        rows = [dict(r, first_token_agree=True, ttft_ms=10.0, recompute_ms=10.0, **TIMING_FIELDS)
                for r in self.rows()]
        earlier = ("The earlier report of these rows (their machine is not recorded in them) was made on: "
                   "AMD EPYC, 2 hardware threads, Linux 6.1.")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "report.md")
            with open(path, "w", encoding="utf-8") as f:
                f.write("# chunkfuse bench report\n\nRows timed with kernels: not recorded 3.\n" + earlier + "\nRows: 3.\n")
            for _ in range(2):
                bench_report.write_report(d, rows, bench_report.aggregate(rows), {})
            with open(path, encoding="utf-8") as f:
                report = f.read().splitlines()
        self.assertEqual(report.count(earlier), 1)
        at = report.index(earlier)
        self.assertTrue(report[at - 1].startswith("Rows timed with kernels: "))
        self.assertTrue(report[at + 1].startswith("Rows: "))


class SpeedupKernelsTest(unittest.TestCase):
    @staticmethod
    def timed(method, example, ttft, isa=None):
        r = row(method, 1.0 if method == "full" else 0.15, example, 1.0)
        r.update(TIMING_FIELDS, first_token_agree=True, ttft_ms=ttft, recompute_ms=ttft)
        if isa:
            r["isa"] = isa
        return r

    def epic(self, rows):
        return next(a for a in bench_report.aggregate(rows)[("d", "m.gguf")] if a["method"] == "epic")

    def test_rows_whose_full_prefill_ran_on_other_kernels_are_left_out_of_the_speedup(self):
        rows = [self.timed("full", e, 1000.0, "avx512") for e in "abc"]
        rows += [self.timed("epic", "a", 100.0, "avx512"), self.timed("epic", "b", 200.0, "avx512"),
                 self.timed("epic", "c", 50.0, "avx2")]  # resumed on an AVX2 machine
        a = self.epic(rows)
        self.assertEqual(a["ttft_other_kernels"], 1)
        self.assertAlmostEqual(a["speedup_vs_full"], 1000.0 / 150.0)  # all three would give 10x
        with tempfile.TemporaryDirectory() as d:
            bench_report.write_report(d, rows, bench_report.aggregate(rows), {})
            with open(os.path.join(d, "report.md"), encoding="utf-8") as f:
                report = f.read()
            self.assertIn("leave out 1 rows whose full prefill ran with other kernels", report)
            # The header says which kernels timed the rows, not only the machine making the report.
            self.assertIn("Rows timed with kernels: avx2 1, avx512 5 ", report)

    def test_rows_without_recorded_kernels_pair_with_each_other(self):
        rows = [self.timed("full", e, 1000.0) for e in "abc"]
        rows += [self.timed("epic", e, t) for e, t in zip("abc", (100.0, 200.0, 50.0))]
        a = self.epic(rows)
        self.assertEqual(a["ttft_other_kernels"], 0)
        self.assertAlmostEqual(a["speedup_vs_full"], 10.0)
        self.assertEqual(bench_report.kernels_line(rows + [self.timed("epic", "d", 1.0, "avx2")]),
                         "avx2 1, not recorded 6")


if __name__ == "__main__":
    unittest.main()

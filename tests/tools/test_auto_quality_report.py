"""Unit tests of tools/auto_quality_report.py (issue 26): the AUC, the signals table and the
held-out feature comparison on records made by hand. Run by ctest (bench_report_py discovers every test here)."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import auto_quality_report  # noqa: E402


def step(ratio, answer, identical, margin, top1=1):
    return {"method": "prophet", "ratio": ratio, "answer": answer, "identical": identical, "margin": margin,
            "entropy": 1.0 - margin, "kl_to_prev": 0.1, "top1": top1}


def signals_row(recs, step_label):
    """`signals` on these records: the cells of the row of one step (e.g. "prophet 0.15")."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            auto_quality_report.signals(type("A", (), {"records": [f.name]})())
    finally:
        os.unlink(f.name)
    row = [line for line in out.getvalue().splitlines() if line.startswith("| " + step_label)][0]
    return [c.strip() for c in row.strip("|").split("|")]


def features_table(folds, questions=None):
    """`features` on two folds of records (and the questions' rows, for --questions): {set label:
    [cell per step]}."""
    paths = []
    for rows in folds + ([questions] if questions else []):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(f.name)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            auto_quality_report.features(type("A", (), {"calibration": paths[0], "held_out": paths[1],
                                                        "questions": paths[2] if questions else None})())
    finally:
        for p in paths:
            os.unlink(p)
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.getvalue().splitlines() if line.startswith("| ") and "features" not in line}


def table_text(report):
    """`table` on this report: what it prints."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(report, f)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            auto_quality_report.table(type("A", (), {"report": f.name})())
    finally:
        os.unlink(f.name)
    return out.getvalue()


class AucTest(unittest.TestCase):
    def test_perfect_chance_and_ties(self):
        self.assertEqual(auto_quality_report.auc([0.9, 0.8, 0.1, 0.2], [1, 1, 0, 0]), 1.0)
        self.assertEqual(auto_quality_report.auc([0.1, 0.2, 0.9, 0.8], [1, 1, 0, 0]), 0.0)
        self.assertEqual(auto_quality_report.auc([1, 1, 1, 1], [1, 0, 1, 0]), 0.5)  # all tied
        self.assertIsNone(auto_quality_report.auc([0.3, 0.4], [1, 1]))  # one class only


class SignalsTableTest(unittest.TestCase):
    def test_answer_agreement_column(self):
        # Step 1 agrees with step 0 on a, b, c; identical on a, b (and on d, which disagrees).
        recs = [
            {"id": "a", "dataset": "d", "context_tokens": 10, "steps": [step(0.05, "x", True, 0.9), step(0.15, "x", True, 0.9)]},
            {"id": "b", "dataset": "d", "context_tokens": 20, "steps": [step(0.05, "y", False, 0.5), step(0.15, "y", True, 0.5)]},
            {"id": "c", "dataset": "d", "context_tokens": 30, "steps": [step(0.05, "z", False, 0.2), step(0.15, "z", False, 0.2)]},
            {"id": "d", "dataset": "d", "context_tokens": 40, "steps": [step(0.05, "u", False, 0.1), step(0.15, "v", True, 0.1)]},
        ]
        cells = signals_row(recs, "prophet 0.15")
        # Identical on 3 of 4. Agreement's AUC over the pairs (identical, the one non-identical c,
        # which agrees): a and b tie with c (0.5 each), d loses (0): 1/3. Agreeing: 3 of 4, of
        # which 2 identical.
        self.assertEqual(cells[1], "0.75")
        self.assertEqual(cells[6], "0.33 (0.75, 0.67)")

    def test_a_step_with_one_class_prints_dashes(self):
        # Every answer identical at the second step: no AUC exists there; the row says "-".
        recs = [{"id": c, "dataset": "d", "context_tokens": 10 * i,
                 "steps": [step(0.05, c, i % 2 == 0, 0.1 * i), step(0.15, c, True, 0.1 * i)]} for i, c in enumerate("abcd")]
        cells = signals_row(recs, "prophet 0.15")
        self.assertEqual(cells[1], "1.00")
        self.assertEqual(cells[2], "-")
        self.assertEqual(cells[6], "- (1.00, 1.00)")


class FeaturesTest(unittest.TestCase):
    def test_logistic_fit_recovers_a_separating_weight(self):
        x = [[v / 10] for v in range(-10, 11)]
        y = [int(v > 0) for v in range(-10, 11)]
        w = auto_quality_report.fit_logistic(x, y, l2=0.01)
        self.assertGreater(w[1], 5)  # steep and positive
        self.assertLess(auto_quality_report.logistic(w, [-0.5]), 0.1)
        self.assertGreater(auto_quality_report.logistic(w, [0.5]), 0.9)

    def test_a_feature_that_separates_held_out_requests_shows(self):
        # Yes/no questions are identical, the others not; margin and entropy say nothing (the
        # same on every record). Only the question-kind set can score above chance held out.
        def rec(i, yes_no):
            s = step(0.15, "x", yes_no, 0.5)
            return {"id": "ds:q%d" % i, "dataset": "ds", "context_tokens": 100, "chunks": 5, "steps": [s]}
        folds = [[rec(10 * fold + i, i % 2 == 0) for i in range(10)] for fold in range(2)]
        questions = [{"_id": "q%d" % (10 * fold + i), "question": ("Is it so?" if i % 2 == 0 else "Who did it?")}
                     for fold in range(2) for i in range(10)]
        rows = {label: cells[0] for label, cells in features_table(folds, questions).items()}
        self.assertEqual(rows["margin, entropy (the predictor)"], "0.50")
        self.assertEqual(rows["+ question kind"], "1.00")

    def test_the_kv_change_sets_score_what_separates_held_out_requests(self):
        # Behind a reuse step, requests whose recomputation moved the context's K/V little are
        # identical, the others not; margin and entropy are the same everywhere. The context
        # set must find it held out, the question set (equal everywhere) must not.
        def rec(i, small):
            change = {"context": {"k": [0.05 if small else 0.4] * 3, "v": [0.1 if small else 0.8] * 3},
                      "question": {"k": [0.2] * 3, "v": [0.2] * 3}}
            s = dict(step(0.15, "x", small, 0.5), kv_change=change, scores={"sum": 40.0, "selected_share": 0.7})
            return {"id": "ds:q%d" % i, "dataset": "ds", "context_tokens": 100, "chunks": 5,
                    "steps": [step(0, "y", False, 0.5), s]}
        rows = features_table([[rec(10 * fold + i, i % 2 == 0) for i in range(10)] for fold in range(2)])
        self.assertEqual(rows["margin, entropy (the predictor)"][1], "0.50")
        self.assertEqual(rows["+ recomputation's KV change, context"][1], "1.00")
        self.assertEqual(rows["+ recomputation's KV change, question"][1], "0.50")
        self.assertEqual(rows["+ recomputation's KV change, context"][0], "-")  # the reuse step: one class
        self.assertEqual(rows["+ selector's score mass (sum, share selected)"][1], "0.50")  # equal everywhere

    def test_the_score_mass_set_scores_what_separates_held_out_requests(self):
        # Identical where the recomputed rows hold most of the probe's attention.
        def rec(i, covered):
            s = dict(step(0.15, "x", covered, 0.5), scores={"sum": 40.0, "selected_share": 0.9 if covered else 0.4})
            return {"id": "ds:q%d" % i, "dataset": "ds", "context_tokens": 100, "chunks": 5, "question_tokens": 10,
                    "steps": [step(0, "y", False, 0.5), s]}
        rows = features_table([[rec(10 * fold + i, i % 3 == 0) for i in range(10)] for fold in range(2)])
        self.assertEqual(rows["+ selector's score mass (sum, share selected)"][1], "1.00")
        self.assertNotIn("+ recomputation's KV change, context", rows)  # these records have none


if __name__ == "__main__":
    unittest.main()


class PlotArgsTest(unittest.TestCase):
    def test_a_title_per_report_or_a_clear_error(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"fixed": [], "auto": [], "reliability": []}, f)
        try:
            args = type("A", (), {"reports": [f.name], "labels": "Qwen 0.5B,Qwen 1.5B", "out": "unused.png"})()
            with self.assertRaises(SystemExit) as e:
                auto_quality_report.plot(args)
            self.assertEqual(str(e.exception), "--labels: 2 names for 1 reports")
        finally:
            os.unlink(f.name)


class TableTest(unittest.TestCase):
    def test_a_plan_per_size_class_is_named_by_its_bound(self):
        fixed = {"method": "epic", "ratio": 0.05, "share": 0.5, "share_low": 0.3, "share_high": 0.7, "mean_ttft_ms": 10.0,
                 "p90_ttft_ms": 12.0}
        plans = [{"min_context_tokens": 0, "steps": ["epic:0.050000"], "threshold": 0.42},
                 {"min_context_tokens": 3000, "steps": [], "threshold": 1.0}]
        target = {"target": 0.9, "share": 0.9, "share_low": 0.8, "share_high": 0.95, "mean_ttft_ms": 50.0, "p90_ttft_ms": 90.0,
                  "cheapest_fixed": dict(fixed, method="full", ratio=1.0, mean_ttft_ms=100.0), "chosen": {"full": 1},
                  "decision_ms": 1.0, "decision_share_of_saved": None, "speedup_vs_cheapest_fixed": 2.0, "meets_target": True,
                  "policy": plans[0], "policies_by_size": plans}
        out = table_text({"examples": 1, "datasets": ["d"], "fingerprint": "ab", "fixed": [fixed], "auto": [target]})
        self.assertIn("| 0+ tokens: epic 0.05; 0.420; 3000+ tokens: none (full prefill) |", out)

    def test_cross_validated_plans_are_grouped_by_their_steps(self):
        """Folds that run the same steps differ only in their thresholds: one group, with the
        range; a fold that runs other steps is its own group; the header says how it was made."""
        def plans(short_steps, threshold):
            return [{"min_context_tokens": 0, "steps": short_steps, "threshold": threshold},
                    {"min_context_tokens": 3000, "steps": [], "threshold": 1.0}]
        folds = [plans(["epic:0.050000"], 0.55), plans(["reuse:0.000000"], 0.46), plans(["epic:0.050000"], 0.60)]
        self.assertEqual(auto_quality_report.fold_plans_text(folds),
                         "0+ tokens: epic 0.05; 0.550-0.600; 3000+ tokens: none (full prefill) (2 of 3 folds) / "
                         "0+ tokens: reuse 0; 0.460; 3000+ tokens: none (full prefill) (1 of 3 folds)")
        fixed = {"method": "full", "ratio": 1.0, "share": 1.0, "share_low": 0.9, "share_high": 1.0, "mean_ttft_ms": 100.0,
                 "p90_ttft_ms": 120.0}
        target = {"target": 0.9, "share": 0.9, "share_low": 0.8, "share_high": 0.95, "mean_ttft_ms": 80.0, "p90_ttft_ms": 110.0,
                  "cheapest_fixed": fixed, "chosen": {"full": 3}, "decision_ms": 1.0, "decision_share_of_saved": 0.1,
                  "speedup_vs_cheapest_fixed": 1.25, "meets_target": True, "fold_policies": folds}
        out = table_text({"examples": 3, "datasets": ["d"], "fingerprint": "ab", "fixed": [fixed], "auto": [target],
                          "cross_validation": {"folds": 3, "fitted_also_on": 7}})
        self.assertIn("3-fold cross-validation, every request replayed by a calibration fitted without it (and on 7 other records)",
                      out)
        self.assertIn("(2 of 3 folds) / 0+ tokens: reuse 0; 0.460", out)

    def test_matrix_rows_mark_misses_and_the_speed_up_target(self):
        """One row per report and asked target: a share under its target says whether its
        interval reaches it; a speed-up of 1.3x at 0.9 or 0.95 is marked where the share meets the
        target too, and nothing saved is a dash."""
        fixed = {"method": "full", "ratio": 1.0, "share": 1.0, "share_low": 0.9, "share_high": 1.0, "mean_ttft_ms": 100.0,
                 "p90_ttft_ms": 120.0}

        def row(target, share, high, speedup, cost):
            return {"target": target, "share": share, "share_low": share - 0.1, "share_high": high, "mean_ttft_ms": 100 / speedup,
                    "p90_ttft_ms": 110.0, "cheapest_fixed": fixed, "decision_share_of_saved": cost,
                    "speedup_vs_cheapest_fixed": speedup, "meets_target": share >= target,
                    "interval_reaches_target": high >= target}
        rep = {"examples": 40, "auto": [row(0.8, 0.7, 0.75, 2.0, 0.05), row(0.9, 0.85, 0.95, 1.4, 0.2), row(0.99, 1.0, 1.0, 1.0, None),
                                        row(0.95, 0.96, 0.99, 1.35, 0.1)]}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(rep, f)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                auto_quality_report.matrix(type("A", (), {"reports": [f.name], "label": ["M, D"], "targets": "0.8,0.9,0.95,0.99"})())
        finally:
            os.unlink(f.name)
        rows = [line for line in out.getvalue().splitlines() if line.startswith("| M, D")]
        self.assertEqual(len(rows), 4)
        self.assertIn("0.700 [0.600, 0.750] **below**", rows[0])
        self.assertIn("| 2.00x | 5% |", rows[0])
        self.assertIn("(interval reaches it)", rows[1])
        self.assertIn("| 1.40x | 20% |", rows[1])  # fast, but its share is under the target: not marked
        self.assertIn("| 1.00x | - |", rows[2])
        self.assertIn("| **1.35x** | 10% |", rows[3])

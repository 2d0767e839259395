"""Unit tests of bench/serve_vs_llama.py's pure helpers (issue 58, item 6): gold F1, the Poisson
schedule, one point's summary and the two workloads, on hand-made data. Run by ctest
(bench_report_py discovers every test here) or: python3 -m unittest discover -s tests/tools."""
import os
import statistics
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import serve_vs_llama as b  # noqa: E402


class GoldF1Test(unittest.TestCase):
    def test_normalisation_drops_case_punctuation_and_articles(self):
        self.assertEqual(b.normalize_answer("The  Rush!"), "rush")
        self.assertEqual(b.normalize_answer("An apple, a day"), "apple day")
        self.assertEqual(b.qa_f1("The Rush.", ["rush"]), 1.0)

    def test_partial_overlap(self):
        # prediction "rock band rush": precision 1/3, recall 1 -> F1 0.5
        self.assertAlmostEqual(b.token_f1("rock band Rush", "Rush"), 0.5)
        # multiset overlap: "rush rush" against "rush": precision 1/2, recall 1
        self.assertAlmostEqual(b.token_f1("rush rush", "rush"), 2 / 3)

    def test_best_gold_and_empty_sides(self):
        self.assertAlmostEqual(b.qa_f1("Neil Peart", ["Rush", "Neil Peart"]), 1.0)
        self.assertEqual(b.token_f1("", "rush"), 0.0)
        self.assertEqual(b.token_f1("the", "the"), 0.0)  # nothing left after normalisation
        self.assertEqual(b.qa_f1("rush", []), 0.0)


class PoissonTest(unittest.TestCase):
    def test_increasing_seeded_and_at_the_rate(self):
        t = b.poisson_arrivals(20000, 4.0, seed=1)
        self.assertEqual(t, b.poisson_arrivals(20000, 4.0, seed=1))
        self.assertNotEqual(t[:10], b.poisson_arrivals(10, 4.0, seed=2))
        self.assertTrue(all(x < y for x, y in zip(t, t[1:])))
        self.assertGreater(t[0], 0.0)
        gaps = [y - x for x, y in zip([0.0] + t, t)]
        self.assertAlmostEqual(statistics.fmean(gaps), 0.25, delta=0.01)
        # exponential gaps: standard deviation equals the mean
        self.assertAlmostEqual(statistics.pstdev(gaps), 0.25, delta=0.015)

    def test_rate_must_be_positive(self):
        with self.assertRaises(ValueError):
            b.poisson_arrivals(3, 0.0, seed=1)


class SummaryTest(unittest.TestCase):
    def test_latency_throughput_and_quality(self):
        recs = [{"idx": i, "ok": True, "ttft_s": float(i + 1), "itl_ms": [10.0, 30.0], "text": "Rush" if i else "x"}
                for i in range(4)]
        recs.append({"idx": 4, "ok": False, "error": "boom"})
        refs = {0: "Rush", 1: "Rush", 2: "Rush", 3: "no"}
        golds = [["Rush"]] * 5
        s = b.summarize_point(recs, 8.0, refs, golds)
        self.assertEqual((s["sent"], s["ok"], s["errors"]), (5, 4, 1))
        self.assertAlmostEqual(s["throughput_req_s"], 0.5)
        self.assertAlmostEqual(s["ttft_s"]["p50"], 2.5)
        self.assertAlmostEqual(s["ttft_s"]["p99"], 3.97)
        self.assertAlmostEqual(s["itl_ms"]["p50"], 20.0)
        self.assertAlmostEqual(s["identical"], 0.5)  # idx 1 and 2 of the four answered
        self.assertAlmostEqual(s["gold_f1"], 0.75)

    def test_no_reference_and_nothing_answered(self):
        s = b.summarize_point([{"idx": 0, "ok": False}], 0.0, None, [["a"]])
        self.assertEqual((s["ok"], s["throughput_req_s"]), (0, 0.0))
        self.assertIsNone(s["identical"])
        self.assertIsNone(s["gold_f1"])


def example(k, n_passages=10, sentence_len=60):
    ctx = [["T%d-%d" % (k, j), ["s%d.%d " % (k, j) + "w" * sentence_len]] for j in range(n_passages)]
    return {"question": "q%d?" % k, "answer": "a%d" % k, "context": ctx,
            "supporting_facts": [["T%d-0" % k, 0], ["T%d-1" % k, 0]]}


class WorkloadTest(unittest.TestCase):
    def setUp(self):
        self.examples = [example(k) for k in range(60)]

    def test_permuted_holds_its_own_passages_in_new_orders(self):
        items = b.permuted_workload(self.examples, 6, 1500, seed=3)
        self.assertEqual(len(items), 6)
        for k, it in enumerate(items):
            user = it["messages"][-1]["content"]
            paragraphs = user.split("\n\n")
            self.assertEqual(paragraphs[0], b.INSTRUCTION)
            self.assertEqual(paragraphs[-1], "Question: q%d?\n%s" % (k, b.ANSWER_HINT))
            self.assertEqual(paragraphs[1:-1], it["passages"])
            own = set(b.example_passages(self.examples[k]))
            self.assertLessEqual(own, set(it["passages"]))
            self.assertGreaterEqual(sum(len(p) + 2 for p in it["passages"]), 1500)
            self.assertEqual(len(set(it["passages"])), len(it["passages"]))
            self.assertEqual(it["golds"], ["a%d" % k])
        # the order is drawn per request: not the file's order
        self.assertNotEqual(items[0]["passages"][:10], b.example_passages(self.examples[0]))

    def test_permuted_is_bounded_by_the_distractor_examples(self):
        with self.assertRaises(SystemExit):
            b.permuted_workload(self.examples, 21, 1500, seed=3)

    def test_prefix_shares_one_system_message(self):
        items = b.prefix_workload(self.examples, 9, 800)
        systems = {it["messages"][0]["content"] for it in items}
        self.assertEqual(len(systems), 1)
        users = [it["messages"][1]["content"] for it in items]
        self.assertEqual(len(set(users)), 9)  # every prompt distinct
        # 800 characters: the gold passages of the first examples until the prefix is that long
        gold = b.example_passages(self.examples[0], {"T0-0", "T0-1"})
        self.assertTrue(systems.pop().startswith(b.serve_load.SYSTEM + "\n\n" + "\n\n".join(gold)))
        self.assertEqual(users[0], "Request 1. Question: q0?\n" + b.ANSWER_HINT)
        n_used = len({it["golds"][0] for it in items})
        self.assertEqual(len(items[0]["passages"]), 2 * n_used)


if __name__ == "__main__":
    unittest.main()

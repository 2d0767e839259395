"""tools/self_check_replay.py on made-up records: the rules are serve/self_check_ledger.cpp's
(Wilson 95% lower bound below q after min_checks(q) = 35 checks at q 0.9, sampling every
1/share-th accepted answer), and a recalibrated step no longer answers. Run by ctest."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import self_check_replay as r  # noqa: E402

# One step that always accepts (weights: p = sigmoid(10)) at threshold 0.5.
CAL = {"steps": [{"method": "epic", "ratio": 0.05, "weights": [10.0, 0.0, 0.0]}],
       "size_classes": [{"min_context_tokens": 0, "policies": [{"quality": 0.95, "steps": [0], "threshold": 0.5},
                                                               {"quality": 1.0, "steps": [], "threshold": 1.0}]}]}


def records(identical):
    return [{"context_tokens": 100, "steps": [{"method": "epic", "ratio": 0.05, "margin": 0.5, "entropy": 1.0,
                                               "identical": x}]} for x in identical]


class SelfCheckReplayTest(unittest.TestCase):
    def test_the_ledger_numbers(self):
        self.assertAlmostEqual(r.wilson_low(18, 24), 0.551, places=3)
        self.assertEqual(r.min_checks(0.9), 35)
        self.assertEqual(r.min_checks(0.5), 20)

    def test_a_step_below_the_target_leaves_the_policy_at_35_checks(self):
        outcomes, events, ledger = r.replay(CAL, records([False, True] * 50), 0.9, 1.0)
        self.assertEqual([e[0] for e in events], [35])  # the 35th request's check fired
        self.assertEqual(outcomes[35:], [True] * 65)  # full prefill from then on
        self.assertEqual(ledger[0][:2], [35, 17])

    def test_a_share_samples_every_kth_answer_and_a_good_step_stays(self):
        _, events, ledger = r.replay(CAL, records([False, True] * 50), 0.9, 0.2)
        self.assertEqual((events, ledger[0][0]), ([], 20))  # 100 answers, every fifth checked: 20 < 35
        _, events, _ = r.replay(CAL, records([True] * 100), 0.9, 1.0)
        self.assertEqual(events, [])


if __name__ == "__main__":
    unittest.main()

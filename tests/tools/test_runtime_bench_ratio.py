"""Unit tests of bench/runtime_bench.py's issue-28 ratio (ours / the better llama.cpp peer of
each rep) on result files made by hand. Run by ctest (every test in tests/tools)."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import runtime_bench  # noqa: E402


def side(prefill_512, decode, rss_mib):
    return {"prefill": [{"n_tokens": 512, "tok_per_s": prefill_512}],
            "decode": {"n_tokens": 64, "tok_per_s": decode}, "rss_wait4_bytes": rss_mib * 2**20}


class BetterPeerRatioTest(unittest.TestCase):
    def setUp(self):
        # Rep 0: repack is the faster peer at prefill, plain at decode; rep 1 the other way
        # round; rep 2 has no plain run (the faster of those present counts).
        self.reps = [
            {"ours": side(300, 30, 100), "llama_repack": side(200, 10, 300), "llama_plain": side(100, 20, 200)},
            {"ours": side(300, 30, 100), "llama_repack": side(100, 20, 200), "llama_plain": side(150, 15, 400)},
            {"ours": side(300, 30, 100), "llama_repack": side(250, 25, 250)},
        ]

    def test_faster_peer_per_rep_for_speed_leaner_for_memory(self):
        prefill = lambda r: r["prefill"][0]["tok_per_s"]
        self.assertEqual(runtime_bench.best_peer_ratios(self.reps, ["repack", "plain"], prefill, True),
                         [300 / 200, 300 / 150, 300 / 250])
        rss = lambda r: r["rss_wait4_bytes"]
        self.assertEqual(runtime_bench.best_peer_ratios(self.reps, ["repack", "plain"], rss, False),
                         [100 / 200, 100 / 200, 100 / 250])

    def test_stored_file_summarized_anew_into_the_table(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"meta": {"peers": ["repack", "plain"], "loadavg_1_5_15_before": [1.0, 0, 0],
                                "loadavg_1_5_15_after": [2.0, 0, 0]}, "reps": self.reps}, f)
        try:
            _, rows = runtime_bench.summarize_file(f.name)
            line = runtime_bench.ratio_table([f.name])
        finally:
            os.unlink(f.name)
        decode = next(r for r in rows if r["metric"].startswith("decode 64"))
        self.assertEqual(decode["best"]["values"], [30 / 20, 30 / 20, 30 / 25])
        # prefill 1.5 / 2.0 / 1.2 -> median 1.50; decode 1.5 / 1.5 / 1.2 -> 1.50 [1.20-1.50]
        self.assertIn("| 300 / 30 | 1.50 [1.20–2.00] | 1.50 [1.20–1.50] | load 1.0/2.0 |", line)


if __name__ == "__main__":
    unittest.main()

"""End-to-end: one K/V budget (serve --kv-budget, issue 58 item 3; src/serve/kv_budget.h) for the
running requests and the cached K/V. A small budget, a sequence of requests with distinct long
system messages that fills the prefix cache, then a request whose reservation (prompt +
max_tokens) fits only once the cache gives room back: it completes, no 5xx, and /metrics shows
the bytes evicted to admit it, with reservations + cached K/V within the budget throughout.
Run: .venv-serve/bin/python -m unittest tests.serve_e2e.test_kv_budget
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402

BUDGET_TOKENS = 400   # the budget, in tokens of K/V of the served model
LARGE_MAX_TOKENS = 40

TOPICS = ["rivers", "mountains", "deserts", "forests", "islands", "glaciers", "volcanoes", "lakes"]


def system_message(topic, words=80):
    base = ("You are a patient geography tutor who explains %s to curious students. " % topic)
    filler = " ".join("%s fact %d." % (topic, i) for i in range(words // 3))
    return base + filler


def bytes_per_token():
    """The served model's K/V bytes a token, from the line a server prints at start-up."""
    probe = h.Server("--kv-budget", "0")
    try:
        m = re.search(r"K/V budget .*?, (\d+) bytes a token", probe.log_text())
        assert m, probe.log_text()
        return int(m.group(1))
    finally:
        probe.stop_cleanly()


class KvBudgetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bpt = bytes_per_token()
        cls.budget = BUDGET_TOKENS * cls.bpt
        cls.server = h.Server("--kv-budget", str(cls.budget))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def chat(self, messages, max_tokens):
        # A request left waiting for room that never comes times out here (it takes ~1 s).
        return self.server.request("POST", "/v1/chat/completions", {
            "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "fusion": {"method": "full", "prefix_cache": True}}, timeout=60)

    def check_books(self, m):
        self.assertLessEqual(m["chunkfuse_kv_reserved_bytes"] + m["chunkfuse_kv_cached_bytes"], self.budget)
        usage = [v for k, v in m.items() if k.startswith("vllm:kv_cache_usage_perc")]
        self.assertEqual(len(usage), 1)
        self.assertLessEqual(usage[0], 1.0)
        self.assertAlmostEqual(usage[0], (m["chunkfuse_kv_reserved_bytes"] + m["chunkfuse_kv_cached_bytes"]) /
                               self.budget, places=6)

    def test_a_large_request_after_a_prefix_heavy_sequence_completes_and_evicts(self):
        m0 = self.server.metrics()
        self.assertEqual(m0["chunkfuse_kv_budget_bytes"], self.budget)
        for topic in TOPICS:
            status, body = self.chat([{"role": "system", "content": system_message(topic)},
                                      {"role": "user", "content": "Name one example."}], 4)
            self.assertEqual(status, 200, body)
            self.assertLess(body["usage"]["prompt_tokens"] + 4, BUDGET_TOKENS)
        m1 = self.server.metrics()
        self.check_books(m1)
        self.assertGreater(m1["chunkfuse_prefix_cache_bytes"], 0)
        self.assertGreater(m1["chunkfuse_kv_cached_bytes"], 0)
        evicted_before = m1["chunkfuse_kv_admission_evicted_bytes_total"]

        # About 270 prompt tokens + 40: fits the budget alone, not beside what the cache holds.
        long_question = "Please summarise the following notes. " + " ".join(
            "Note %d says the harbour opens at dawn." % i for i in range(22))
        status, body = self.chat([{"role": "user", "content": long_question}], LARGE_MAX_TOKENS)
        self.assertEqual(status, 200, body)
        need = body["usage"]["prompt_tokens"] + LARGE_MAX_TOKENS
        self.assertLessEqual(need, BUDGET_TOKENS)
        self.assertGreater(need * self.bpt + m1["chunkfuse_kv_cached_bytes"], self.budget,
                           "the large request must not fit beside the cached K/V, or nothing had to be evicted")
        m2 = self.server.metrics()
        self.check_books(m2)
        self.assertGreater(m2["chunkfuse_kv_admission_evicted_bytes_total"], evicted_before)
        self.assertEqual(m2["chunkfuse_request_errors_total"], 0)


if __name__ == "__main__":
    unittest.main()

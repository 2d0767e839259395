"""End-to-end: the auto policy as a server-wide default (issue 60). `serve --quality q` (and
`--ttft-ms T`) gives requests that name no fusion method the auto policy, and its choice is in
every response: the JSON body and, in a stream, the final chunk, whether or not usage was asked
for; documents new to the server are priced as cold chunk caches.
Run: python3 -m unittest tests.serve_e2e.test_auto_policy (only the standard library is used).
"""
import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402

DOCS = [
    "Title: Lake Orta\nLake Orta is a lake in northern Italy. The island of San Giulio lies in its centre.",
    "Title: Monte Rosa\nMonte Rosa is a mountain massif in the Alps whose meltwater feeds several lakes of Piedmont.",
]
# SmolLM2's shipped calibration runs a ladder step up to about 0.87 (data/auto_calibrations/).
QUALITY = 0.5


def chat_body(question, **extra):
    body = {"messages": [{"role": "user", "content": "Question: " + question}], "max_tokens": 8, "temperature": 0,
            "documents": DOCS}
    body.update(extra)
    return body


def sse_chunks(text):
    events = [e for e in text.split("\n\n") if e.strip()]
    assert events and events[-1] == "data: [DONE]", events
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


class AutoPolicyDefaultTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--quality", str(QUALITY))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def assert_choice(self, choice):
        for key in ("method", "ratio", "predicted_quality", "quality", "threshold", "steps_run", "calibrated", "trace"):
            self.assertIn(key, choice)
        self.assertEqual(choice["quality"], QUALITY)  # the server's target
        self.assertTrue(choice["calibrated"], choice)

    def test_a_plain_request_gets_the_policy_and_its_choice(self):
        status, r = self.server.post("/v1/chat/completions", chat_body("Which island lies in Lake Orta?"))
        self.assertEqual(status, 200, r)
        self.assert_choice(r["chunkfuse"]["auto"])

    def test_a_stream_reports_the_choice_in_its_final_chunk_without_usage(self):
        status, text = self.server.post("/v1/chat/completions", chat_body("What feeds the lakes of Piedmont?",
                                                                          stream=True))
        self.assertEqual(status, 200, text)
        chunks = sse_chunks(text)
        self.assertFalse(any("usage" in c for c in chunks))  # not asked for
        last = chunks[-1]
        self.assertIsNotNone(last["choices"][0]["finish_reason"])
        self.assert_choice(last["chunkfuse"]["auto"])
        # With usage asked for, the usage chunk carries it too.
        status, text = self.server.post("/v1/chat/completions", chat_body(
            "What feeds the lakes of Piedmont?", stream=True, stream_options={"include_usage": True}))
        self.assertEqual(status, 200, text)
        chunks = sse_chunks(text)
        self.assert_choice(chunks[-2]["chunkfuse"]["auto"])  # the finish chunk
        self.assert_choice(chunks[-1]["chunkfuse"]["auto"])  # the usage chunk

    def test_a_request_naming_a_method_overrides_the_default(self):
        status, r = self.server.post("/v1/chat/completions", chat_body("Which island lies in Lake Orta?",
                                                                       fusion={"method": "epic", "ratio": 0.2}))
        self.assertEqual(status, 200, r)
        self.assertNotIn("auto", r["chunkfuse"])


class ColdChunksTest(unittest.TestCase):
    """Item 2: documents new to the server answer with full prefill at once (computing their chunk
    caches first would cost more than it saves), their caches are computed after the answer, and
    the same request then finds them warm and runs the ladder."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--quality", str(QUALITY))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def test_cold_documents_take_full_prefill_and_are_warm_for_the_next_request(self):
        body = chat_body("Which island lies in Lake Orta?")
        status, r = self.server.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, r)
        choice = r["chunkfuse"]["auto"]
        self.assertEqual((choice["method"], choice["reason"], choice["steps_run"]), ("full", "cold_chunks", 1), choice)
        self.assertEqual(choice["cold_chunks"], len(DOCS))
        deadline = time.time() + 60  # one idle task per chunk, after the answer
        while self.server.metrics()["chunkfuse_background_tasks_total"] < len(DOCS):
            self.assertLess(time.time(), deadline, "the cold chunk caches were not filled")
            time.sleep(0.1)
        status, r = self.server.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, r)
        choice = r["chunkfuse"]["auto"]
        self.assertNotIn("cold_chunks", choice)
        self.assertIn(choice["reason"], ("accepted", "escalated"), choice)
        self.assertEqual(r["chunkfuse"]["chunk_hits"], len(DOCS))


class MatchChunksClientTest(unittest.TestCase):
    """An unmodified client under --match-chunks (passages stuffed into a plain message, no
    fusion field, no documents) gets the server's auto policy and its choice."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--match-chunks", "--quality", str(QUALITY))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    # Paragraphs long enough to be passages (passage_matching.h: 128 bytes).
    PASSAGES = [
        "The Carrow Lighthouse stands on the northern cliffs of Port Elwen. It was designed by the engineer "
        "Margaret Hale and first lit in 1868, after the wreck of the schooner Alba on the Elwen reefs.",
        "Port Elwen is the main harbour of the island of Tresk. Its ferry to the mainland sails twice a day in "
        "summer and once a day in winter, weather permitting, from the granite quay built in 1901.",
    ]

    def test_stuffed_passages_get_the_policy(self):
        body = {"messages": [{"role": "user", "content": "Use the following context to answer.\n\n" +
                              "\n\n".join(self.PASSAGES) + "\n\nQuestion: Who designed the lighthouse?"}],
                "max_tokens": 8, "temperature": 0}
        status, r = self.server.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, r)
        self.assertEqual(r["chunkfuse"]["passages"]["matched"], len(self.PASSAGES))
        self.assertEqual(r["chunkfuse"]["passages"]["computed"], len(self.PASSAGES))  # prefilled in full
        choice = r["chunkfuse"]["auto"]
        self.assertEqual((choice["quality"], choice["reason"]), (QUALITY, "cold_chunks"), choice)
        deadline = time.time() + 60
        while self.server.metrics()["chunkfuse_background_tasks_total"] < len(self.PASSAGES):
            self.assertLess(time.time(), deadline, "the cold chunk caches were not filled")
            time.sleep(0.1)
        status, r = self.server.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, r)
        self.assertIn(r["chunkfuse"]["auto"]["reason"], ("accepted", "escalated"), r["chunkfuse"])
        self.assertEqual(r["chunkfuse"]["passages"]["hit"], len(self.PASSAGES))


class BudgetTest(unittest.TestCase):
    """Item 1: `serve --ttft-ms` (and fusion.ttft_ms): the plan fits a first-token budget by this
    machine's cost model, measured at start-up; the decision reports the budget, which
    constraint bound, and the predicted and actual TTFT."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--ttft-ms", "100000")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def test_the_server_budget_and_a_request_budget(self):
        self.assertIn("cost model for --ttft-ms", self.server.log_text())
        status, r = self.server.post("/v1/chat/completions", chat_body("Which island lies in Lake Orta?"))
        self.assertEqual(status, 200, r)
        choice = r["chunkfuse"]["auto"]
        # A budget nothing strains: full prefill, the best plan, and nothing bound.
        self.assertEqual((choice["method"], choice["bound"], choice["ttft_budget_ms"]), ("full", "none", 100000), choice)
        self.assertGreater(choice["predicted_ttft_ms"], 0)
        self.assertGreater(choice["actual_ttft_ms"], 0)
        # A request's own budget that no plan meets: the cheapest plan, and it says so.
        status, r = self.server.post("/v1/chat/completions", chat_body(
            "Which island lies in Lake Orta?", fusion={"method": "auto", "ttft_ms": 0.001}))
        self.assertEqual(status, 200, r)
        choice = r["chunkfuse"]["auto"]
        self.assertEqual(choice["bound"], "ttft_unmet", choice)
        self.assertNotEqual(choice["method"], "full")
        status, err = self.server.post("/v1/chat/completions", chat_body(
            "Which island lies in Lake Orta?", fusion={"method": "epic", "ttft_ms": 50}))
        self.assertEqual((status, err["error"]["param"]), (400, "fusion.ttft_ms"), err)


class ServeQualityFlagTest(unittest.TestCase):
    def refused(self, *args):
        out = subprocess.run([h.binary_path(), "serve", "-m", h.model_path(), "--port", "0", *args],
                             capture_output=True, text=True, timeout=60)
        self.assertNotEqual(out.returncode, 0, out.stderr)
        return out.stderr

    def test_bad_values_stop_the_server_at_start_with_a_clear_error(self):
        for q in ("0", "1.5", "-0.2", "nan"):
            self.assertIn("--quality must be in (0, 1]", self.refused("--quality", q))
        self.assertIn("--quality is a setting of the auto policy", self.refused("--method", "epic", "--quality", "0.9"))
        self.assertIn("--method auto needs --quality", self.refused("--method", "auto"))
        for t in ("0", "-5", "inf"):
            self.assertIn("--ttft-ms must be a number of milliseconds > 0", self.refused("--ttft-ms", t))
        self.assertIn("--ttft-ms is a setting of the auto policy", self.refused("--method", "epic", "--ttft-ms", "100"))

    def test_help_shows_the_flag(self):
        out = subprocess.run([h.binary_path(), "serve", "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("--quality", out.stdout)
        self.assertIn("--ttft-ms", out.stdout)


if __name__ == "__main__":
    unittest.main()

"""End-to-end: the server checks itself while serving (issue 60 item 3). `serve --self-check
SHARE` runs a share of the served fused answers again with full prefill when idle; the counts
per plan, with Wilson intervals, are in GET /v1/self_check and /metrics. A share outside [0, 1]
stops the server at start with the reason; 0 checks nothing.
Run: python3 -m unittest tests.serve_e2e.test_self_check (only the standard library is used).
"""
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


def chat_body(fusion):
    return {"messages": [{"role": "user", "content": "Question: Which island lies in Lake Orta?"}], "max_tokens": 8,
            "temperature": 0, "documents": DOCS, "fusion": fusion}


def wait_for(server, completed):
    """The ledger once `completed` checks are done (the bound only stops a hung test)."""
    for _ in range(3000):
        status, body = server.get("/v1/self_check")
        assert status == 200, body
        if body["completed"] >= completed:
            return body
        time.sleep(0.02)
    raise AssertionError("the checks did not finish: %s" % body)


class SelfCheckTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--self-check", "1")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def test_served_fused_answers_are_checked_and_reported(self):
        ids = []
        for fusion in ({"method": "epic", "ratio": 0.2}, {"method": "reuse"}, {"method": "full"}):
            status, r = self.server.post("/v1/chat/completions", chat_body(fusion))
            self.assertEqual(status, 200, r)
            ids.append(r["id"])
        ledger = wait_for(self.server, 2)
        status, detail = self.server.get("/v1/details/" + ids[0])
        self.assertEqual(status, 200, detail)
        self.assertEqual((detail["self_check"]["plan"], detail["self_check"]["sampled"]), ("epic@0.2", True))
        status, detail = self.server.get("/v1/details/" + ids[2])
        self.assertNotIn("self_check", detail)  # full prefill is not checked
        self.assertEqual(ledger["object"], "self_check")
        self.assertEqual(ledger["share"], 1)
        plans = {p["plan"]: p for p in ledger["plans"]}
        self.assertEqual(sorted(plans), ["epic@0.2", "reuse@0"])  # full prefill is the reference, not checked
        for p in plans.values():
            self.assertEqual(p["checked"], 1)
            low, high = p["identical_interval"]
            self.assertTrue(0 <= low <= p["identical"] <= high <= 1, p)
        metrics = self.server.metrics()
        self.assertEqual(metrics['chunkfuse_self_check_checked_total{plan="epic@0.2"}'], 1)
        self.assertEqual(metrics['chunkfuse_self_check_identical_total{plan="reuse@0"}'], plans["reuse@0"]["identical"])
        self.assertIn('chunkfuse_self_check_identical_lower{plan="reuse@0"}', metrics)
        self.assertEqual(metrics["chunkfuse_self_check_dropped_total"], 0)


class SelfCheckOffTest(unittest.TestCase):
    def test_share_zero_checks_nothing(self):
        server = h.Server("--self-check", "0")
        try:
            status, r = server.post("/v1/chat/completions", chat_body({"method": "reuse"}))
            self.assertEqual(status, 200, r)
            status, ledger = server.get("/v1/self_check")
            self.assertEqual(status, 200, ledger)
            self.assertEqual((ledger["sampled"], ledger["plans"]), (0, []))
        finally:
            server.stop()


class SelfCheckFlagTest(unittest.TestCase):
    def test_help_names_the_flag(self):
        out = subprocess.run([h.binary_path(), "serve", "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("--self-check", out.stdout)

    def test_a_share_outside_zero_one_stops_the_server_with_the_reason(self):
        for bad in ("1.5", "-0.1"):
            out = subprocess.run([h.binary_path(), "serve", "-m", h.model_path(), "--port", "0", "--self-check", bad],
                                 capture_output=True, text=True, timeout=60)
            self.assertNotEqual(out.returncode, 0, bad)
            self.assertIn("--self-check must be a share in [0, 1]", out.stderr + out.stdout, bad)


if __name__ == "__main__":
    unittest.main()

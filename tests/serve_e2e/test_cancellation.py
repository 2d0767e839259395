"""Work nobody waits for is not done (issue 58 item 4), over real HTTP: a client that closes its
connection while its long prompt is being prefilled (streamed or not) cancels the request within
a piece of the chunked prefill, and the server goes on serving.

The measure is the server's own count of prefill pieces (chunkfuse_prefill_pieces_total, one per
pause of a split pass): the cancelled request must stop far short of the pieces its whole prefill
takes, which is measured first on the same prompt.
"""
import json
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402

PIECE_ROWS = 32


class CancellationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--prefill-chunk", str(PIECE_ROWS))
        _, models = cls.server.get("/v1/models")
        cls.model = models["data"][0]["id"]
        # ~1000 prompt tokens: about 30 pieces of 32 rows.
        cls.prompt = "".join("Line %d of the log: the service answered in time.\n" % i for i in range(90))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def body(self, stream, max_tokens, salt):
        # The salt keeps the prefix cache from serving one request's prompt to the next.
        return {"model": self.model, "prompt": salt + self.prompt, "max_tokens": max_tokens, "temperature": 0,
                "stream": stream}

    def wait_metrics(self, cond, timeout=60):
        deadline = time.time() + timeout
        m = self.server.metrics()
        while time.time() < deadline and not cond(m):
            time.sleep(0.05)
            m = self.server.metrics()
        return m

    def send_and_leave(self, body, after_s):
        data = json.dumps(body).encode()
        s = socket.create_connection(self.server.host_port(), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        time.sleep(after_s)
        s.close()

    def test_a_client_that_leaves_mid_prefill_cancels_it(self):
        before = self.server.metrics()
        status, full = self.server.post("/v1/completions", self.body(False, 1, "Whole. "))
        self.assertEqual(status, 200, full)
        self.assertGreater(full["usage"]["prompt_tokens"], 20 * PIECE_ROWS)
        m = self.server.metrics()
        whole = m["chunkfuse_prefill_pieces_total"] - before["chunkfuse_prefill_pieces_total"]
        self.assertGreaterEqual(whole, 20, "the whole prefill ran in pieces")
        for i, stream in enumerate((False, True)):
            with self.subTest(stream=stream):
                before = self.server.metrics()
                self.send_and_leave(self.body(stream, 200, "Left %d. " % i), after_s=0.3)
                m = self.wait_metrics(lambda m: m["chunkfuse_requests_cancelled_total"]
                                      > before["chunkfuse_requests_cancelled_total"])
                self.assertGreater(m["chunkfuse_requests_cancelled_total"],
                                   before["chunkfuse_requests_cancelled_total"], self.server.log_text()[-2000:])
                pieces = m["chunkfuse_prefill_pieces_total"] - before["chunkfuse_prefill_pieces_total"]
                print("RELIABILITY client left mid-prefill (stream=%s): %d of the whole prefill's %d pieces run"
                      % (stream, pieces, whole), file=sys.stderr)
                self.assertLess(pieces, whole / 2, "the cancelled prefill stopped early")
                self.assertEqual(m["chunkfuse_completion_tokens_total"], before["chunkfuse_completion_tokens_total"])
                self.assertEqual(self.wait_metrics(lambda m: m["chunkfuse_running_requests"] == 0)
                                 ["chunkfuse_running_requests"], 0)
        # The server goes on serving.
        status, again = self.server.post("/v1/completions", self.body(False, 4, "After. "))
        self.assertEqual(status, 200, again)
        self.assertTrue(again["choices"][0]["text"])

    def test_a_client_that_leaves_a_chunk_registration_stops_it(self):
        # Issue 59: POST /v1/chunks computes one cache per text on the scheduler; a client that
        # closes its connection stops the list at the next text, and nothing is registered.
        texts = ["Passage %d of the registration. " % i + self.prompt[:2000] for i in range(16)]
        data = json.dumps({"texts": texts}).encode()
        before = self.server.metrics()
        s = socket.create_connection(self.server.host_port(), timeout=60)
        s.sendall(b"POST /v1/chunks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        m = self.wait_metrics(lambda m: m.get("chunkfuse_chunk_texts_registering", 0) > 0)
        self.assertGreater(m.get("chunkfuse_chunk_texts_registering", 0), 0, "the registration never started")
        time.sleep(0.2)
        s.close()
        m = self.wait_metrics(lambda m: m.get("chunkfuse_chunk_texts_registering", 0) == 0, timeout=120)
        self.assertEqual(m.get("chunkfuse_chunk_texts_registering", 0), 0)
        computed = m["chunkfuse_store_computes_total"] - before["chunkfuse_store_computes_total"]
        print("RELIABILITY client left a POST /v1/chunks of %d texts: %d caches computed" % (len(texts), computed),
              file=sys.stderr)
        self.assertLess(computed, len(texts) / 2, "the registration went on after its client left")
        # The server goes on serving, a registration included.
        status, reply = self.server.post("/v1/chunks", {"texts": ["After the abandoned registration."]})
        self.assertEqual(status, 200, reply)

    def test_a_queued_request_whose_client_left_is_never_prefilled(self):
        # A long non-streamed answer holds the scheduler's attention; a second client sends
        # a request and leaves while it is in the queue or prefilling.
        import threading
        results = []
        t = threading.Thread(target=lambda: results.append(
            self.server.post("/v1/completions", self.body(False, 60, "Busy. "))))
        before = self.server.metrics()
        t.start()
        self.wait_metrics(lambda m: m["chunkfuse_running_requests"] >= 1 or
                          m["chunkfuse_prefill_pieces_total"] > before["chunkfuse_prefill_pieces_total"])
        self.send_and_leave(self.body(False, 60, "Queued. "), after_s=0.1)
        m = self.wait_metrics(lambda m: m["chunkfuse_requests_cancelled_total"]
                              > before["chunkfuse_requests_cancelled_total"])
        self.assertGreater(m["chunkfuse_requests_cancelled_total"], before["chunkfuse_requests_cancelled_total"])
        t.join(timeout=300)
        self.assertEqual(results[0][0], 200, results)
        m = self.server.metrics()
        # Only the busy request generated tokens.
        self.assertLessEqual(m["chunkfuse_completion_tokens_total"] - before["chunkfuse_completion_tokens_total"], 60)


if __name__ == "__main__":
    unittest.main()

"""Prefill pieces sized for the streams (issue 58 item 1, serve --itl-target-ms), over real HTTP.

While an answer streams, a long prompt that arrives is prefilled in pieces sized by time (auto:
the gap between two streamed tokens aimed at 3 decode steps), far smaller than --prefill-chunk;
alone, it goes in pieces of --prefill-chunk. Either way it gets the same answer, bit for bit the
same greedy text: how the load cut a prompt into pieces must not change what it is told. The
server's own counters are the measure (chunkfuse_prefill_pieces_total, chunkfuse_prefill_piece_rows).
A bad value stops the server at start with a clear error.
"""
import os
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402

CHUNK = 256


class ItlTargetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # No prefix cache: the second send of the prompt must be prefilled again.
        cls.server = h.Server("--prefill-chunk", str(CHUNK), "--prefix-cache-budget", "0")
        _, models = cls.server.get("/v1/models")
        cls.model = models["data"][0]["id"]
        # ~900 prompt tokens: 3 pauses in pieces of 256.
        cls.prompt = "".join("Entry %d of the ledger: the shipment of %d crates arrived on day %d.\n"
                             % (i, 3 * i + 7, i % 28 + 1) for i in range(50)) + "The number of entries is"

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def complete(self, prompt, max_tokens):
        status, out = self.server.post("/v1/completions", {"model": self.model, "prompt": prompt,
                                                           "max_tokens": max_tokens, "temperature": 0})
        self.assertEqual(status, 200, out)
        return out

    def pieces(self):
        return self.server.metrics()["chunkfuse_prefill_pieces_total"]

    def test_a_prompt_beside_a_stream_goes_in_smaller_pieces_and_gets_the_same_answer(self):
        before = self.pieces()
        alone = self.complete(self.prompt, 8)
        self.assertGreater(alone["usage"]["prompt_tokens"], 3 * CHUNK)
        alone_pauses = self.pieces() - before
        self.assertEqual(alone_pauses, alone["usage"]["prompt_tokens"] // CHUNK - (alone["usage"]["prompt_tokens"] % CHUNK == 0),
                         "alone: pieces of --prefill-chunk rows")

        # A long answer streams (one token a decode step) while the same prompt arrives.
        first_token = threading.Event()
        streamed = []

        def stream():
            client = h.openai_client(self.server)
            for chunk in client.completions.create(model=self.model, prompt="Count from one to five hundred: 1, 2, 3,",
                                                   max_tokens=300, temperature=0, stream=True):
                if chunk.choices and chunk.choices[0].text:
                    streamed.append(chunk.choices[0].text)
                    first_token.set()

        t = threading.Thread(target=stream)
        t.start()
        self.assertTrue(first_token.wait(120), "the stream started")
        before = self.pieces()
        beside = self.complete(self.prompt, 8)
        beside_pauses = self.pieces() - before  # the stream's own prompt is prefilled already
        rows = self.server.metrics()["chunkfuse_prefill_piece_rows"]
        t.join(timeout=600)
        self.assertFalse(t.is_alive())
        print("RELIABILITY prompt of %d tokens: %d pauses alone, %d beside a stream (last piece %d rows)"
              % (alone["usage"]["prompt_tokens"], alone_pauses, beside_pauses, rows), file=sys.stderr)
        self.assertGreaterEqual(beside_pauses, 2 * alone_pauses + 2, "beside a stream the pieces are smaller")
        self.assertLess(rows, CHUNK)
        self.assertEqual(beside["choices"][0]["text"], alone["choices"][0]["text"],
                         "the pieces a prompt was cut into do not change its answer")
        self.assertGreater(len(streamed), 50)


class ItlTargetFlagTest(unittest.TestCase):
    def test_bad_values_stop_the_server_at_start_with_a_clear_error(self):
        for bad in ("fast", "-5", "nan", "12ms"):
            out = subprocess.run([h.binary_path(), "serve", "-m", h.model_path(), "--port", "0",
                                  "--itl-target-ms", bad], capture_output=True, text=True, timeout=60)
            self.assertNotEqual(out.returncode, 0, out.stderr)
            self.assertIn("--itl-target-ms must be auto, 0 (off) or milliseconds", out.stderr)


if __name__ == "__main__":
    unittest.main()

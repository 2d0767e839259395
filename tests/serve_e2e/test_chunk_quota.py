"""End-to-end: the per-key bound on POST /v1/chunks texts in flight (issue 58 item 4,
serve --max-key-chunk-texts). One key's long registration holds its bound; while it runs, the
same key's next POST is answered 429 "key_busy" at once, another key's is served, and once
the first is done the key may register again. Real server, real HTTP, two API keys."""
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402

KEYS = ("key-alpha-0123456789", "key-beta-0123456789")


def long_text(seed, words=450):
    # Distinct texts (a cache hit would finish at once): ~1,000 tokens each.
    return " ".join("passage%d word%d about topic %d." % (seed, i, (i * 7 + seed) % 97) for i in range(words // 5))


class ChunkQuotaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--api-key", KEYS[0], "--api-key", KEYS[1], "--max-chunk-texts", "3",
                              "--max-key-chunk-texts", "3", "--prefill-chunk", "64", api_key=KEYS[0])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def post_chunks(self, key, texts):
        return self.server.request("POST", "/v1/chunks", {"texts": texts}, headers={"Authorization": "Bearer " + key})

    def gauge(self):
        return self.server.metrics().get("chunkfuse_chunk_texts_registering", 0.0)

    def test_a_key_at_its_bound_waits_its_turn_and_other_keys_do_not(self):
        first = {}
        t = threading.Thread(target=lambda: first.update(reply=self.post_chunks(KEYS[0], [long_text(i) for i in range(3)])))
        t.start()
        try:
            deadline = time.time() + 60
            while self.gauge() < 3 and time.time() < deadline and t.is_alive():
                time.sleep(0.01)
            self.assertTrue(t.is_alive(), "the first registration ended before the test could overlap it")
            self.assertEqual(self.gauge(), 3)
            status, body = self.post_chunks(KEYS[0], ["one more text for the same key"])
            self.assertEqual(status, 429, body)
            self.assertEqual(body["error"]["code"], "key_busy", body)
            self.assertIn("--max-key-chunk-texts", body["error"]["message"])
            status, body = self.post_chunks(KEYS[1], ["a text of another key"])
            self.assertEqual(status, 200, body)  # served, after the scheduler's turn
        finally:
            t.join(timeout=120)
        self.assertFalse(t.is_alive())
        status, body = first["reply"]
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body["data"]), 3)
        self.assertEqual(self.gauge(), 0)
        self.assertGreaterEqual(self.server.metrics().get("chunkfuse_chunk_posts_refused_total", 0), 1)
        status, body = self.post_chunks(KEYS[0], ["the key may register again"])
        self.assertEqual(status, 200, body)

    def test_a_list_past_the_per_request_limit_is_413_not_429(self):
        # 4 texts can never be registered (--max-chunk-texts 3): too large, not "retry later".
        status, body = self.post_chunks(KEYS[0], ["text %d" % i for i in range(4)])
        self.assertEqual(status, 413, body)
        self.assertIn("--max-chunk-texts", body["error"]["message"])

    def test_a_bound_below_the_per_request_limit_is_refused_at_start(self):
        with self.assertRaises(RuntimeError) as cm:
            h.Server("--max-chunk-texts", "8", "--max-key-chunk-texts", "4")
        self.assertIn("--max-key-chunk-texts 4 is below --max-chunk-texts 8", str(cm.exception))


if __name__ == "__main__":
    unittest.main()

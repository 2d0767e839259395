"""`chunkfuse serve --match-chunks` (issue 27) against the real server: an unmodified openai
client that stuffs passages into its messages, as LangChain's "stuff" chain does, gets its
passages served from chunk caches the second time, in any order; /v1/completions too; a
server without the flag never matches; near-duplicates are computed, not served from their
neighbour's cache; hostile message shapes get answers, not errors or stalls."""
import glob
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402

SYSTEM = "You are a helpful assistant. Answer the question using the passages. Answer briefly."
PASSAGES = [
    "The Carrow Lighthouse stands on the northern cliffs of Port Elwen. It was designed by the engineer "
    "Margaret Hale and first lit in 1868, after the wreck of the schooner Alba on the Elwen reefs.",
    "Port Elwen is the main harbour of the island of Tresk. Its ferry to the mainland sails twice a day in "
    "summer and once a day in winter, weather permitting, from the granite quay built in 1901.",
    "The island of Tresk is known for its salt marshes, its granite quarries and the chapel of Saint Elwen, "
    "whose bell was cast from the bronze of the Alba's recovered cannon in 1870.",
    "Margaret Hale trained under the lighthouse builder Thomas Stevenson in Edinburgh before she moved to "
    "Tresk, where she also designed the harbour beacon and the quay's iron crane.",
]


def stuffed(order, question="Who designed the lighthouse near Port Elwen?", tag=""):
    # What LangChain's stuff chain sends: the documents joined by blank lines in one message.
    context = "\n\n".join(PASSAGES[i] + tag for i in order)
    return "Use the following context to answer.\n\n" + context + "\n\nQuestion: " + question


class MatchChunksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--match-chunks", "--method", "cacheblend", "--ratio", "0.2")
        cls.client = h.openai_client(cls.server)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def chat(self, user, **kw):
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            max_tokens=kw.pop("max_tokens", 8), temperature=0, **kw)
        body = json.loads(raw.text)
        return raw.parse(), body["chunkfuse"]

    def test_permuted_passages_hit_their_chunk_caches(self):
        tag = " (Permutation test.)"  # passages no other test sends
        reply, cf = self.chat(stuffed([0, 1, 2, 3], tag=tag))
        self.assertTrue(reply.choices[0].message.content is not None)
        self.assertEqual(cf["passages"]["matched"], 4)
        self.assertEqual(cf["passages"]["computed"], 4)
        _, cf2 = self.chat(stuffed([3, 1, 0, 2], tag=tag))
        self.assertEqual(cf2["passages"]["matched"], 4)
        self.assertEqual(cf2["passages"]["hit"], 4)  # every passage seen before, at any position
        self.assertEqual(cf2["passages"]["computed"], 0)
        self.assertGreater(cf2["prefix_hit_tokens"], 0)  # the system prompt, exact
        _, cf3 = self.chat(stuffed([2, 0], tag=tag))
        self.assertEqual((cf3["passages"]["hit"], cf3["passages"]["computed"]), (2, 0))

    def test_a_one_character_near_duplicate_is_computed(self):
        self.chat(stuffed([0, 1]))
        near = PASSAGES[1].replace("twice", "twice!")
        user = "Context:\n\n" + PASSAGES[0] + "\n\n" + near + "\n\nQuestion: when does the ferry sail?"
        _, cf = self.chat(user)
        self.assertEqual((cf["passages"]["hit"], cf["passages"]["computed"]), (1, 1))

    def test_completions_prompt_is_matched(self):
        prompt = "Passages:\n\n" + PASSAGES[2] + "\n\n" + PASSAGES[3] + "\n\nQ: who designed the beacon?\nA:"
        status, body = self.server.post("/v1/completions", {"model": self.model, "prompt": prompt, "max_tokens": 6,
                                                            "temperature": 0})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["chunkfuse"]["passages"]["matched"], 2)

    def test_request_naming_full_prefill_is_not_matched(self):
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=[{"role": "user", "content": stuffed([0, 1, 2])}], max_tokens=4,
            temperature=0, extra_body={"fusion": {"method": "full"}})
        self.assertNotIn("passages", json.loads(raw.text)["chunkfuse"])

    def test_characters_split_across_tokens_are_answered_streamed_or_not(self):
        # Byte-level BPE cuts these characters across tokens; the request's details hold a
        # piece per prompt token. Counting their bytes threw (incomplete UTF-8): a 500 for the
        # answer, and on a stream an uncaught exception that ended the whole process.
        user = stuffed([0, 1, 2, 3], tag=" Ōfuji Noburō 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 日本語の文章。")
        body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
                "max_tokens": 6, "temperature": 0}
        status, reply = self.server.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, reply)
        self.assertEqual(reply["chunkfuse"]["passages"]["matched"], 4)
        status, detail = self.server.get("/v1/details/" + reply["id"])
        self.assertEqual(status, 200, detail)
        status, text = self.server.post("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(status, 200, text)
        self.assertTrue(text.rstrip().endswith("data: [DONE]"), text[-300:])
        self.assertNotIn('"error"', text)
        self.assertIsNone(self.server.proc.poll(), "the server died")

    def test_hostile_shapes_answer(self):
        tiny = "\n\n".join(["ab"] * 1000) + "\n\nQuestion: what?"
        _, cf = self.chat(tiny, max_tokens=2)
        self.assertNotIn("passages", cf)  # no paragraph is long enough: an ordinary prompt
        huge_system = "Context:\n\n" + " ".join(["granite"] * 600)
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=[{"role": "system", "content": huge_system}, {"role": "user", "content": "Q?"}],
            max_tokens=2, temperature=0)
        self.assertEqual(json.loads(raw.text)["chunkfuse"]["passages"]["matched"], 1)
        many = "\n\n".join("Passage %d on the granite quay of Port Elwen, whose ferry sails twice a day in summer "
                           "and once in winter; the quay was built in 1901 from island granite." % i for i in range(80)) + "\n\nQuestion: what?"
        status, body = self.server.post("/v1/chat/completions", {
            "model": self.model, "messages": [{"role": "user", "content": many}], "max_tokens": 2})
        # More passages than --max-documents (64): the rest stays text; or the prompt is too long.
        self.assertIn(status, (200, 413), body)
        if status == 200:
            self.assertLessEqual(body["chunkfuse"]["passages"]["matched"], 64)


class IsolatedMatchTest(unittest.TestCase):
    """--isolate-keys with --match-chunks (issue 59): a key's matching sees only the chunks it
    registered. Before, the matcher indexed every key's chunks, so `passages.registered` (and
    `hit`) told key B that another key had registered (or sent) a paragraph B guessed."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--api-key", "tenant-a", "--api-key", "tenant-b", "--isolate-keys", "--match-chunks",
                              "--method", "cacheblend", api_key="tenant-a")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def as_key(self, key, method, path, body=None):
        return self.server.request(method, path, body=body, headers={"Authorization": "Bearer " + key})

    def passages(self, key, user):
        status, body = self.as_key(key, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": user}], "max_tokens": 4, "temperature": 0})
        self.assertEqual(status, 200, body)
        return body["chunkfuse"]["passages"]

    def test_a_key_matches_only_its_own_registered_chunks(self):
        secret = PASSAGES[0] + " (Registered by tenant a only.)"
        # Two short paragraphs, registered as one chunk: only a registered text makes them a passage.
        pair = "Tresk salt is raked by hand.\n\nIt dries in July."
        status, reg = self.as_key("tenant-a", "POST", "/v1/chunks", {"texts": [secret, pair]})
        self.assertEqual(status, 200, reg)
        guess = "Context:\n\n" + secret + "\n\n" + pair + "\n\nQuestion: who designed it?"
        own = self.passages("tenant-a", guess)
        self.assertEqual((own["matched"], own["registered"]), (2, 2), own)
        other = self.passages("tenant-b", guess)
        self.assertEqual(other["registered"], 0, other)  # nothing says tenant a registered them
        self.assertEqual(other["matched"], 1, other)  # the long paragraph alone is a passage
        for figure in ("hit", "computed"):  # shared caches: whether it was cached is not said either
            self.assertNotIn(figure, other)
        # Once b registers them itself, b's matching sees them.
        status, _ = self.as_key("tenant-b", "POST", "/v1/chunks", {"texts": [secret, pair]})
        self.assertEqual(status, 200)
        mine = self.passages("tenant-b", guess)
        self.assertEqual((mine["matched"], mine["registered"]), (2, 2), mine)
        # a's delete leaves b's claim, and b still matches; a does not any more.
        status, body = self.as_key("tenant-a", "DELETE", "/v1/chunks/" + reg["data"][1]["id"])
        self.assertEqual(status, 200, body)
        self.assertEqual(self.passages("tenant-b", guess)["registered"], 2)
        self.assertEqual(self.passages("tenant-a", guess)["registered"], 1)


class WithoutMatchChunksTest(unittest.TestCase):
    def test_off_by_default(self):
        server = h.Server("--method", "cacheblend")
        try:
            status, body = server.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": stuffed([0, 1, 2])}], "max_tokens": 4})
            self.assertEqual(status, 200, body)
            self.assertNotIn("passages", body["chunkfuse"])
            self.assertEqual(body["chunkfuse"]["chunk_misses"] + body["chunkfuse"]["chunk_hits"], 0)
        finally:
            code, log = server.stop()
            self.assertEqual(code, 0, log)

    def test_match_chunks_with_full_prefill_is_refused(self):
        folders = lambda: set(glob.glob(os.path.join(tempfile.gettempdir(), "chunkfuse-e2e-*")))
        before = folders()
        with self.assertRaises(RuntimeError) as ctx:
            h.Server("--match-chunks", "--method", "full")
        self.assertIn("--match-chunks needs a fusion method", str(ctx.exception))
        self.assertEqual(folders(), before)  # the refused start cleaned up after itself


if __name__ == "__main__":
    unittest.main()

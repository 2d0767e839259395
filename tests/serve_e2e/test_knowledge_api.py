"""End-to-end: the knowledge-base API of issue 12 against the real server over real HTTP.
Uploads a .txt and a .pdf (made here, read by poppler's pdftotext), waits for the chunk
caches, retrieves with BM25, answers with `retrieval` instead of `documents`, reads the
per-request details (recomputed positions, timings), and checks bad input: an empty file, a
binary file named .pdf, an upload over --max-body, an unknown format, a document deleted while
a request uses it; each gets a clear 4xx and the server keeps serving.
"""
import base64
import json
import os
import shutil
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402

TXT = (
    "The Zorblat river flows through the city of Quenton. It is famous for its purple water.\n\n"
    "Quenton was founded in 1412 by traders from the north. The old market still stands.\n\n"
    "The main export of Quenton is copper wire, shipped down the Zorblat river every spring.\n"
)
PDF_LINES = ["The Velmora lighthouse was built in 1887.", "Its lamp can be seen for forty kilometres."]


def b64(data):
    return base64.b64encode(data).decode()


class KnowledgeApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--max-body", "1MiB")
        _, models = cls.server.get("/v1/models")
        cls.model = models["data"][0]["id"]

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def upload(self, name, data, **kw):
        body = {"name": name, "content_base64": b64(data)}
        body.update(kw)
        return self.server.post("/v1/documents", body)

    def assert_error(self, status, body, want):
        self.assertEqual(status, want, body)
        self.assertTrue(body["error"]["message"], body)

    def test_upload_retrieve_answer_details(self):
        s, txt = self.upload("quenton.txt", TXT.encode(), chunk_tokens=32)
        self.assertEqual(s, 202, txt)
        self.assertGreaterEqual(txt["n_chunks"], 2)  # three paragraphs, budget 32 tokens
        s, pdf = self.upload("velmora.pdf", h.make_pdf(PDF_LINES))
        self.assertEqual(s, 202, pdf)
        h.wait_documents_ready(self.server)

        s, doc = self.server.get("/v1/documents/" + pdf["id"])
        self.assertEqual(s, 200, doc)
        self.assertEqual(doc["status"], "ready")
        self.assertIn("Velmora lighthouse", doc["chunks"][0]["text"])
        s, chunks = self.server.get("/v1/knowledge/chunks")
        mine = [c for c in chunks["data"] if c["document_id"] in (txt["id"], pdf["id"])]
        self.assertEqual(len(mine), txt["n_chunks"] + pdf["n_chunks"])
        for c in mine:
            self.assertEqual(c["state"], "ready", c)
            self.assertIn(c["cache"], ("disk", "memory"))
            self.assertGreater(c["n_tokens"], 0)
            self.assertEqual(len(c["hash"]), 16)
            self.assertTrue(c["summary"])

        s, r = self.server.post("/v1/retrieve", {"query": "When was the Velmora lighthouse built?", "k": 2})
        self.assertEqual(s, 200, r)
        self.assertEqual(r["data"][0]["document_id"], pdf["id"])
        self.assertGreater(r["data"][0]["score"], 0)

        body = {"model": self.model, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "What is the main export of Quenton?"}],
                "retrieval": {"k": 2}, "fusion": {"method": "qcfuse", "ratio": 0.3}}
        s, resp = self.server.post("/v1/chat/completions", body)
        self.assertEqual(s, 200, resp)
        used = resp["chunkfuse"]["retrieval"]
        self.assertEqual(len(used), 2)
        self.assertEqual(used[0]["document_id"], txt["id"])
        s, d = self.server.get("/v1/details/" + resp["id"])
        self.assertEqual(s, 200, d)
        self.assertEqual(d["method"], "qcfuse")
        self.assertEqual(len(d["chunks"]), 2)
        recomputed = sum(len(c["recomputed"]) for c in d["chunks"])
        self.assertEqual(recomputed, d["recomputed_tokens"])
        self.assertEqual(d["recomputed_tokens"], resp["chunkfuse"]["recomputed_tokens"])
        self.assertEqual(d["context_tokens"], sum(len(c["tokens"]) for c in d["chunks"]))
        self.assertEqual(d["recomputed_tokens"], int(0.3 * d["context_tokens"]))
        self.assertIn("scores", d["chunks"][0])  # QCFuse's own token scores
        self.assertIn("critical layers", d["score_kind"])
        self.assertTrue(all(c["last_layer"] == d["n_layers"] - 1 for c in d["chunks"]))
        for phase in ("lookup_ms", "load_ms", "selection_ms", "recompute_ms", "ttft_ms"):
            self.assertGreaterEqual(d["timings"][phase], 0)
        # Full prefill recomputes every context token.
        body["fusion"] = {"method": "full"}
        s, resp = self.server.post("/v1/chat/completions", body)
        s, d = self.server.get("/v1/details/" + resp["id"])
        self.assertEqual(d["recomputed_tokens"], d["context_tokens"])
        # Cache-Craft may stop unfocused chunks early: each chunk says its last layer.
        body["fusion"] = {"method": "cachecraft", "ratio": 0.3}
        s, resp = self.server.post("/v1/chat/completions", body)
        self.assertEqual(s, 200, resp)
        s, d = self.server.get("/v1/details/" + resp["id"])
        for c in d["chunks"]:
            self.assertTrue(0 <= c["last_layer"] < d["n_layers"], c["last_layer"])
                # Use counts went up.
        s, doc = self.server.get("/v1/documents/" + txt["id"])
        self.assertGreater(sum(c["uses"] for c in doc["chunks"]), 0)

        # Deleting a chunk, then the document.
        cid = doc["chunks"][0]["id"]
        s, _ = self.server.request("DELETE", "/v1/knowledge/chunks/" + cid)
        self.assertEqual(s, 200)
        s, doc = self.server.get("/v1/documents/" + txt["id"])
        self.assertNotIn(cid, [c["id"] for c in doc["chunks"]])
        for d_id in (txt["id"], pdf["id"]):
            s, _ = self.server.request("DELETE", "/v1/documents/" + d_id)
            self.assertEqual(s, 200)
            s, err = self.server.get("/v1/documents/" + d_id)
            self.assert_error(s, err, 404)

    def test_every_selector_shows_its_token_scores(self):
        """Each selector's own per-token score reaches the details for every retrieved chunk's
        tokens; a score-ranked selector recomputes exactly the global top floor(rho N) of its
        scores, a per-chunk one (EPIC, Cache-Craft) the top of each chunk's."""
        s, doc = self.upload("ferns.txt", (
            "Tree ferns of the Kallis valley grow ten metres tall and live for five centuries.\n\n"
            "The valley floods each autumn; the ferns survive because their roots hold air pockets.\n\n"
            "Botanists from Orlen first described the Kallis tree fern in 1903.\n").encode(), chunk_tokens=24)
        self.assertEqual(s, 202, doc)
        h.wait_documents_ready(self.server)
        ratio = 0.25
        global_top = ("qcfuse", "prophet", "cacheblend", "fusionrag")
        per_chunk = ("epic", "cachecraft")
        unscored = ("random", "reuse", "full")
        try:
            for method in global_top + per_chunk + unscored:
                with self.subTest(method=method):
                    body = {"model": self.model, "max_tokens": 2, "temperature": 0,
                            "messages": [{"role": "user", "content": "How tall do Kallis tree ferns grow?"}],
                            "retrieval": {"k": 3, "query": "Kallis tree ferns valley"},
                            "fusion": {"method": method, "ratio": ratio}}
                    s, resp = self.server.post("/v1/chat/completions", body)
                    self.assertEqual(s, 200, resp)
                    s, d = self.server.get("/v1/details/" + resp["id"])
                    self.assertEqual(s, 200, d)
                    self.assertTrue(d["score_kind"], d)
                    self.assertGreaterEqual(len(d["chunks"]), 2)
                    if method in unscored:
                        self.assertTrue(d["score_kind"].startswith("none"), d["score_kind"])
                        self.assertTrue(all("scores" not in c for c in d["chunks"]))
                        continue
                    for c in d["chunks"]:
                        self.assertEqual(len(c["scores"]), len(c["tokens"]), c)
                        self.assertTrue(all(0 <= x <= 1 for x in c["scores"]))
                    if method in global_top:
                        # (score, global position) of every context token; ties go to the lower slot.
                        flat = [(-x, c["begin"] + i) for c in d["chunks"] for i, x in enumerate(c["scores"])]
                        want = sorted(p for _, p in sorted(flat)[:int(ratio * len(flat))])
                        got = sorted(c["begin"] + i for c in d["chunks"] for i in c["recomputed"])
                        self.assertEqual(got, want)
                    else:
                        for c in d["chunks"]:
                            chosen = [c["scores"][i] for i in c["recomputed"]]
                            rest = [x for i, x in enumerate(c["scores"]) if i not in set(c["recomputed"])]
                            if chosen and rest:
                                self.assertGreaterEqual(min(chosen), max(rest))
            # The chunks' cache state shows the offline work those requests left: QCFuse's
            # anchors and Cache-Craft's variants (one per chunk and prefix seen).
            _, chunks = self.server.get("/v1/knowledge/chunks")
            used = [c for c in chunks["data"] if c["document_id"] == doc["id"] and c["uses"] > 0]
            self.assertGreaterEqual(len(used), 2)
            for c in used:
                st = c["cache_state"]
                self.assertTrue(st["memory"] and st["disk"] and st["anchors"], c)
                self.assertGreaterEqual(st["variants"], 1, c)
                self.assertIsNone(st["remote"])
        finally:
            self.server.request("DELETE", "/v1/documents/" + doc["id"])

    def test_csv_and_jsonl(self):
        s, d = self.upload("staff.csv", b"name,room\nAda,12\nBob,\"7, east\"\n")
        self.assertEqual(s, 202, d)
        s, j = self.upload("faq.jsonl", b'{"title": "Hours", "text": "Open 9 to 5."}\n{"text": "Closed on Sundays."}\n')
        self.assertEqual(s, 202, j)
        h.wait_documents_ready(self.server)
        s, doc = self.server.get("/v1/documents/" + d["id"])
        self.assertIn("name: Bob; room: 7, east", doc["chunks"][0]["text"])
        s, doc = self.server.get("/v1/documents/" + j["id"])
        self.assertIn("Hours\nOpen 9 to 5.", doc["chunks"][0]["text"])
        for x in (d, j):
            self.server.request("DELETE", "/v1/documents/" + x["id"])

    def test_pasted_text(self):
        s, d = self.server.post("/v1/documents", {"name": "note", "text": "A pasted note about otters."})
        self.assertEqual(s, 202, d)
        self.assertEqual(d["format"], "txt")
        self.server.request("DELETE", "/v1/documents/" + d["id"])

    def test_bad_input(self):
        self.assert_error(*self.upload("empty.txt", b""), 400)
        s, body = self.upload("fake.pdf", os.urandom(2000))
        self.assert_error(s, body, 400)
        self.assertIn("not a PDF", body["error"]["message"])
        s, body = self.upload("broken.pdf", b"%PDF-1.4\n" + os.urandom(3000))
        self.assert_error(s, body, 400)
        self.assert_error(*self.upload("binary.txt", b"\x00\x01\x02\xff" * 100), 400)
        s, body = self.upload("sheet.xlsx", b"PK\x03\x04 not really")
        self.assert_error(s, body, 415)
        self.assertIn("unknown document format", body["error"]["message"])
        s, body = self.upload("big.txt", b"a " * (2 << 20))  # over --max-body (1 MiB here; 50 MB alike)
        self.assert_error(s, body, 413)
        self.assert_error(*self.server.post("/v1/documents", {"name": "x.txt"}), 400)
        self.assert_error(*self.server.post("/v1/documents", {"name": "x.txt", "text": "hi", "chunk_tokens": 0}), 400)
        self.assert_error(*self.server.post("/v1/retrieve", {"k": 2}), 400)
        self.assert_error(*self.server.get("/v1/details/nope"), 404)
        self.assert_error(*self.server.request("DELETE", "/v1/documents/nope"), 404)
        both = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "documents": ["x"], "retrieval": {"k": 1}}
        self.assert_error(*self.server.post("/v1/chat/completions", both), 400)
        self.assert_error(*self.server.post("/v1/chat/completions", dict(both, documents=[], retrieval=5)), 400)
        self.assertEqual(self.server.get("/health")[0], 200)

    def test_document_deleted_while_a_request_uses_it(self):
        s, d = self.server.post("/v1/documents", {"name": "gone.txt", "text": "The Kestrel bridge is made of oak."})
        self.assertEqual(s, 202, d)
        h.wait_documents_ready(self.server)
        out = {}

        def ask():
            out["r"] = self.server.post("/v1/chat/completions", {
                "model": self.model, "max_tokens": 24, "messages": [{"role": "user", "content": "What is the Kestrel bridge made of?"}],
                "retrieval": {"k": 1}, "fusion": {"method": "reuse"}})

        t = threading.Thread(target=ask)
        t.start()
        s, _ = self.server.request("DELETE", "/v1/documents/" + d["id"])
        self.assertEqual(s, 200)
        t.join(120)
        # The request took the chunk's text when it was retrieved: it completes.
        self.assertEqual(out["r"][0], 200, out["r"])
        # The document itself is gone: a clear 404 to whoever still names it (the page's Delete).
        s, err = self.server.request("DELETE", "/v1/documents/" + d["id"])
        self.assert_error(s, err, 404)
        self.assertIn("no document '%s'" % d["id"], err["error"]["message"])
        self.assert_error(*self.server.get("/v1/documents/" + d["id"]), 404)
        self.assertEqual(self.server.get("/health")[0], 200)


class KnowledgeDefaultLimitTest(unittest.TestCase):
    def test_a_50_mb_upload_at_the_default_limit(self):
        # The case at the server's own default --max-body (8 MiB), not a lowered one.
        server = h.Server()
        try:
            body = json.dumps({"name": "big.txt", "content_base64": b64(b"word " * (10 << 20))}).encode()
            self.assertGreater(len(body), 50 << 20)
            try:
                s, err = server.request("POST", "/v1/documents", raw=body)
            except (BrokenPipeError, ConnectionResetError) as e:
                # The server answers 413 from the headers and closes before the body is sent.
                self.fail("no 413 answer: %r" % e)
            self.assertEqual(s, 413, err)
            self.assertIn("larger than the limit of 8388608 bytes", err["error"]["message"])
            self.assertEqual(server.get("/health")[0], 200)
            _, docs = server.get("/v1/documents")
            self.assertEqual(docs["data"], [])
        finally:
            code, log = server.stop()
            self.assertEqual(code, 0, log)


class KnowledgePersistenceTest(unittest.TestCase):
    """The knowledge base outlives the server: a real restart on the same store folder lists
    the same documents, chunks and use counts; a damaged file is set aside, not a crash."""

    def setUp(self):
        self.store = tempfile.mkdtemp(prefix="chunkfuse-kb-")
        self.addCleanup(shutil.rmtree, self.store, True)

    def start(self):
        server = h.Server(cache_dir=self.store)
        self.addCleanup(lambda: server.proc.poll() is None and server.stop())
        return server

    def test_documents_survive_a_restart(self):
        server = self.start()
        s, doc = server.post("/v1/documents", {"name": "moons.txt", "text": "Tavrin has three moons.\n\nThe largest moon is Ossel."})
        self.assertEqual(s, 202, doc)
        h.wait_documents_ready(server)
        _, models = server.get("/v1/models")
        s, resp = server.post("/v1/chat/completions", {
            "model": models["data"][0]["id"], "max_tokens": 2, "messages": [{"role": "user", "content": "How many moons has Tavrin?"}],
            "retrieval": {"k": 1}, "fusion": {"method": "qcfuse", "ratio": 0.2}})
        self.assertEqual(s, 200, resp)
        _, before = server.get("/v1/knowledge/chunks")
        self.assertEqual(sum(c["uses"] for c in before["data"]), 1)
        self.assertTrue(any(c["cache_state"]["anchors"] for c in before["data"]))  # QCFuse prepared its anchors
        code, log = server.stop()
        self.assertEqual(code, 0, log)
        path = os.path.join(self.store, "knowledge-base.json")
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)

        server = self.start()
        self.assertRegex(server.log_text(), r"knowledge base: loaded 1 documents, \d+ chunks \(0 to precompute\)")
        _, docs = server.get("/v1/documents")
        self.assertEqual([(d["id"], d["name"], d["status"]) for d in docs["data"]], [(doc["id"], "moons.txt", "ready")])
        _, after = server.get("/v1/knowledge/chunks")
        keep = ("id", "text", "summary", "hash", "cache_id", "uses", "n_tokens")
        self.assertEqual([{k: c.get(k) for k in keep} for c in after["data"]],
                         [{k: c.get(k) for k in keep} for c in before["data"]])
        for c in after["data"]:
            self.assertTrue(c["cache_state"]["disk"], c)
            self.assertIsNone(c["cache_state"]["remote"])  # no remote tier configured
        s, r = server.post("/v1/retrieve", {"query": "largest moon", "k": 1})
        self.assertEqual(r["data"][0]["document_id"], doc["id"])
        # New uploads do not reuse an old id.
        s, doc2 = server.post("/v1/documents", {"name": "b.txt", "text": "Another note."})
        self.assertNotEqual(doc2["id"], doc["id"])

    def test_a_damaged_file_is_set_aside(self):
        path = os.path.join(self.store, "knowledge-base.json")
        os.makedirs(self.store, exist_ok=True)
        with open(path, "w") as f:
            f.write('{"version": 1, "documents": [{"id": ')
        server = self.start()
        self.assertIn("knowledge-base.json is damaged", server.log_text())
        self.assertTrue(os.path.exists(path + ".damaged"))
        _, docs = server.get("/v1/documents")
        self.assertEqual(docs["data"], [])
        s, d = server.post("/v1/documents", {"name": "ok.txt", "text": "Still serving."})
        self.assertEqual(s, 202, d)
        self.assertTrue(os.path.exists(path))  # a fresh file

    def test_a_link_in_place_of_the_file_is_never_followed(self):
        os.makedirs(self.store, exist_ok=True)
        outside = os.path.join(tempfile.mkdtemp(prefix="chunkfuse-kb-outside-"), "kb.json")
        self.addCleanup(shutil.rmtree, os.path.dirname(outside), True)
        original = '{"version": 1, "next_document": 0, "documents": []}'
        with open(outside, "w") as f:
            f.write(original)
        path = os.path.join(self.store, "knowledge-base.json")
        os.symlink(outside, path)
        server = self.start()
        self.assertIn("not a regular file", server.log_text())
        s, d = server.post("/v1/documents", {"name": "ok.txt", "text": "Written beside the link, not through it."})
        self.assertEqual(s, 202, d)
        self.assertFalse(os.path.islink(path))
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        with open(outside) as f:
            self.assertEqual(f.read(), original)


class KnowledgeAccessTest(unittest.TestCase):
    def test_page_is_public_and_the_api_needs_the_key(self):
        server = h.Server("--api-key", "sekrit", api_key=None)
        try:
            s, _ = server.request("GET", "/v1/documents")
            self.assertEqual(s, 401)
            server.api_key = "sekrit"
            s, body = server.request("GET", "/v1/documents")
            self.assertEqual(s, 200, body)
            server.api_key = None
            s, page = server.request("GET", "/ui/")
            self.assertIn(s, (200, 404))  # 404 only when web/ is not built: a page saying so
            self.assertIn("<", page)
            # Nothing outside the page's folder, however the path is spelled.
            for path in ("/ui//etc/passwd", "/ui/../README.md", "/ui/%2e%2e/README.md", "/ui/assets/../../CMakeLists.txt"):
                s, body = server.request("GET", path)
                self.assertEqual(s, 404, path)
                self.assertNotIn("root:", str(body))
        finally:
            server.stop()

    def test_isolated_keys_refuse_the_shared_knowledge_base(self):
        server = h.Server("--api-key", "a", "--api-key", "b", "--isolate-keys", api_key="a")
        try:
            s, body = server.post("/v1/documents", {"name": "x.txt", "text": "hello"})
            self.assertEqual(s, 403, body)
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main()

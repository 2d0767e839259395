"""End-to-end: two `chunkfuse serve` replicas sharing one chunk-cache tier on a real
redis-server (issue 13), all on loopback, started and stopped here.

A chunk computed through replica A is a remote hit on replica B, which computes nothing and
answers exactly as A does; then the faults: Redis stopped mid-run and back, FLUSHALL,
maxmemory full, a value corrupted in place, a value made for another key (values made by
another model: tests/kv/test_remote_tier.cpp, as CI has one model), a replica killed -9
while it writes. No request fails and nothing corrupt, foreign or partial is ever served.
"""
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redis_helpers as rh  # noqa: E402
import serve_helpers as h  # noqa: E402

SYSTEM = "You are a helpful assistant. Answer the question using the passages. Answer briefly."
QUESTION = "Which place is described?"
FUSION = {"method": "epic", "ratio": 0.3}  # a fused method: the chunk caches are reused


def passage(tag, words=40):
    """A passage of its own per test (so tests do not share chunks), about `words` words."""
    body = " ".join("%s-%d" % (tag, i) if i % 7 == 0 else w
                    for i, w in enumerate(("the lake lies between green hills and old stone villages " * 8).split()[:words]))
    return "Title: %s\n%s." % (tag, body)


def remote_args(redis):
    return (*redis.replica_args(), "--remote-retry-ms", "200", "--remote-timeout-ms", "1000")


class RemoteTierTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.redis = rh.Redis()
        cls.a = h.Server(*remote_args(cls.redis))
        cls.b = h.Server(*remote_args(cls.redis))

    @classmethod
    def tearDownClass(cls):
        logs = []
        for s in (cls.a, cls.b):
            code, log = s.stop()
            if code != 0:
                logs.append("server exited with %s on SIGTERM:\n%s" % (code, log))
        cls.redis.close()
        if logs:
            raise AssertionError("\n".join(logs))

    def ask(self, server, docs, max_tokens=8):
        status, body = server.post("/v1/chat/completions", {
            "model": "chunkfuse", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question: " + QUESTION}],
            "documents": docs, "fusion": FUSION})
        self.assertEqual(status, 200, body)
        return body["choices"][0]["message"]["content"]

    def register(self, server, docs):
        status, body = server.post("/v1/chunks", {"texts": docs})
        self.assertEqual(status, 200, body)
        return [c["id"] for c in body["data"]]

    def wait_in_redis(self, ids, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if set(ids) <= set(self.redis.manifests()):
                return
            time.sleep(0.05)
        self.fail("entries %s never reached redis" % ids)

    def metric(self, server, name):
        return server.metrics().get(name, 0.0)

    def assert_entries_whole(self):
        """Every committed manifest has all its pieces (nothing partial is visible)."""
        import json
        for cid, key in self.redis.manifests().items():
            m = json.loads(self.redis.cli("GET", key))
            for i in range(m["pieces"]):
                self.assertEqual(self.redis.cli("EXISTS", "%s:%s:%d" % (key, m["sum"], i)), "1", (cid, i))

    def test_a_chunk_computed_on_a_is_a_remote_hit_on_b(self):
        docs = [passage("shared-%d" % i) for i in range(3)]
        ids = self.register(self.a, docs)
        self.wait_in_redis(ids)
        computes, remote_hits = (self.metric(self.b, "chunkfuse_store_computes_total"),
                                 self.metric(self.b, "chunkfuse_remote_hits_total"))
        answer_b = self.ask(self.b, docs)
        self.assertEqual(self.metric(self.b, "chunkfuse_store_computes_total"), computes)  # B computed nothing
        self.assertEqual(self.metric(self.b, "chunkfuse_remote_hits_total"), remote_hits + 3)
        self.assertGreater(self.metric(self.b, "chunkfuse_remote_read_bytes_total"), 0)
        self.assertGreater(self.metric(self.b, "chunkfuse_remote_read_seconds_count"), 0)
        self.assertGreater(self.metric(self.a, "chunkfuse_remote_written_bytes_total"), 0)
        self.assertEqual(self.ask(self.a, docs), answer_b)

    def test_knowledge_base_lists_the_remote_tier(self):
        # The page's cache state (GET /v1/knowledge/chunks) says when Redis holds a chunk.
        s, d = self.a.post("/v1/documents", {"name": "remote.txt", "text": passage("kb-remote")})
        self.assertEqual(s, 202, d)
        h.wait_documents_ready(self.a)
        mine = lambda: [c for c in self.a.get("/v1/knowledge/chunks")[1]["data"] if c["document_id"] == d["id"]]
        self.wait_in_redis([c["cache_id"] for c in mine()])
        for c in mine():
            self.assertIs(c["cache_state"]["remote"], True, c)
            self.assertTrue(c["cache_state"]["disk"], c)
        self.a.request("DELETE", "/v1/documents/" + d["id"])

    def test_redis_stopped_mid_run_then_back(self):
        failures, answers = [], []
        stop = threading.Event()

        def traffic(server, tag):
            n = 0
            while not stop.is_set():
                status, body = server.post("/v1/chat/completions", {
                    "model": "chunkfuse", "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": QUESTION}],
                    "documents": [passage("%s-%d" % (tag, n), 20)], "fusion": FUSION})
                (answers if status == 200 else failures).append((status, body))
                n += 1

        threads = [threading.Thread(target=traffic, args=(s, t)) for s, t in ((self.a, "down-a"), (self.b, "down-b"))]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            self.redis.stop()
            time.sleep(1.5)
            errors_down = self.metric(self.a, "chunkfuse_remote_errors_total") + self.metric(
                self.b, "chunkfuse_remote_errors_total")
            self.redis.start()  # same port, empty
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        self.assertEqual(failures, [])
        self.assertGreater(len(answers), 4)
        self.assertGreater(errors_down, 0)
        # Reconnected: a chunk computed on A now reaches Redis and is a remote hit on B.
        docs = [passage("back")]
        ids = self.register(self.a, docs)
        self.wait_in_redis(ids)
        hits = self.metric(self.b, "chunkfuse_remote_hits_total")
        self.ask(self.b, docs)
        self.assertEqual(self.metric(self.b, "chunkfuse_remote_hits_total"), hits + 1)
        self.assertEqual(self.metric(self.a, "chunkfuse_remote_up"), 1)

    def test_flushall_and_maxmemory_cost_only_recomputes(self):
        docs = [passage("flushed")]
        ids = self.register(self.a, docs)
        self.wait_in_redis(ids)
        want = self.ask(self.a, docs)
        self.assertEqual(self.redis.cli("FLUSHALL"), "OK")
        computes = self.metric(self.b, "chunkfuse_store_computes_total")
        self.assertEqual(self.ask(self.b, docs), want)
        self.assertEqual(self.metric(self.b, "chunkfuse_store_computes_total"), computes + 1)

        # Full: every write refused (noeviction under a cap below what it holds).
        self.redis.cli("SETRANGE", "filler", 300000, "x")  # 300 KB, more than the cap below
        self.redis.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
        self.redis.cli("CONFIG", "SET", "maxmemory", "1")
        try:
            refused = self.metric(self.a, "chunkfuse_remote_write_errors_total")
            full_docs = [passage("full")]
            want = self.ask(self.a, full_docs)
            deadline = time.time() + 10
            while self.metric(self.a, "chunkfuse_remote_write_errors_total") <= refused and time.time() < deadline:
                time.sleep(0.05)
            self.assertGreater(self.metric(self.a, "chunkfuse_remote_write_errors_total"), refused)
            self.assertEqual(self.ask(self.b, full_docs), want)  # B computes it; nothing half-written
        finally:
            self.redis.cli("CONFIG", "SET", "maxmemory", "0")
            self.redis.cli("DEL", "filler")
        self.assert_entries_whole()

    def test_corrupt_or_foreign_values_are_never_served(self):
        docs = [passage("corrupt"), passage("foreign"), passage("donor")]
        ids = self.register(self.a, docs)
        self.wait_in_redis(ids)
        want = [self.ask(self.a, [d]) for d in docs[:2]]
        # Corrupted in place: bytes of one piece overwritten.
        key = self.redis.manifests()[ids[0]]
        piece = sorted(self.redis.keys(key + ":*"))[0]
        self.redis.cli("SETRANGE", piece, 100, "this is not what was stored")
        # Foreign: another entry's value (pieces and manifest) stored under this chunk's name.
        donor = self.redis.manifests()[ids[2]]
        victim = self.redis.manifests()[ids[1]]
        for k in self.redis.keys(victim + ":*"):
            self.redis.cli("DEL", k)
        for k in [donor] + self.redis.keys(donor + ":*"):
            self.redis.cli("COPY", k, victim + k[len(donor):], "REPLACE")

        corrupt, computes = (self.metric(self.b, "chunkfuse_remote_corrupt_total"),
                             self.metric(self.b, "chunkfuse_store_computes_total"))
        self.assertEqual(self.ask(self.b, [docs[0]]), want[0])
        self.assertEqual(self.ask(self.b, [docs[1]]), want[1])
        self.assertEqual(self.metric(self.b, "chunkfuse_remote_corrupt_total"), corrupt + 2)
        self.assertEqual(self.metric(self.b, "chunkfuse_store_computes_total"), computes + 2)
        self.assertIn("checksum differs", self.b.log_text())
        # The manifest's tag binds the entry to its id (issue 29 item 9): refused before decompressing.
        self.assertIn("manifest tag does not match", self.b.log_text())

    def test_a_remote_tier_needs_a_store_key_and_a_wrong_key_is_never_served(self):
        # Without a key, whoever can write to Redis could poison every replica: refused at start.
        proc = h.subprocess.run([h.binary_path(), "serve", "-m", h.model_path(), "--port", "0",
                                 "--remote", self.redis.url], capture_output=True, text=True, timeout=120)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--store-key-file", proc.stderr + proc.stdout)
        # A writer with another key (an attacker with Redis access, or a misconfigured replica):
        # its entries fail B's HMAC check, are counted, and B recomputes.
        other_key = os.path.join(self.redis.tmp, "other.key")
        fd = os.open(other_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # private (issue 29 item 10)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        intruder = h.Server("--remote", self.redis.url, "--store-key-file", other_key)
        docs = [passage("intruder")]
        try:
            before = set(self.redis.manifests())
            want = self.ask(intruder, docs)
            deadline = time.time() + 30
            while not set(self.redis.manifests()) - before and time.time() < deadline:
                time.sleep(0.05)
            self.assertTrue(set(self.redis.manifests()) - before, "the intruder's entry never reached Redis")
        finally:
            intruder.stop()
        corrupt = self.metric(self.b, "chunkfuse_remote_corrupt_total")
        computes = self.metric(self.b, "chunkfuse_store_computes_total")
        self.assertEqual(self.ask(self.b, docs), want)
        self.assertEqual(self.metric(self.b, "chunkfuse_remote_corrupt_total"), corrupt + 1)
        self.assertEqual(self.metric(self.b, "chunkfuse_store_computes_total"), computes + 1)
        # Refused on the manifest's tag over the compressed bytes, before decompressing (issue 29 item 9).
        self.assertIn("manifest tag does not match", self.b.log_text())

    def test_replica_killed_while_writing_leaves_no_partial_entry(self):
        c = h.Server(*remote_args(self.redis))
        docs = [passage("killed-%d" % i, 120) for i in range(12)]
        before = set(self.redis.manifests())
        def register_all():
            try:
                c.post("/v1/chunks", {"texts": docs})
            except OSError:
                pass  # killed under it, as intended

        t = threading.Thread(target=register_all)
        t.start()
        deadline = time.time() + 30
        while not set(self.redis.manifests()) - before and time.time() < deadline:
            time.sleep(0.01)
        c.proc.kill()  # SIGKILL, mid-way through the batch and its remote writes
        t.join(timeout=30)
        c.stop()
        self.assertLess(len(set(self.redis.manifests()) - before), len(docs))  # killed mid-way
        self.assert_entries_whole()
        corrupt, incomplete = (self.metric(self.b, "chunkfuse_remote_corrupt_total"),
                               self.metric(self.b, "chunkfuse_remote_incomplete_total"))
        remote_hits = self.metric(self.b, "chunkfuse_remote_hits_total")
        for d in docs[:4]:
            self.ask(self.b, [d], max_tokens=2)
        self.assertEqual(self.metric(self.b, "chunkfuse_remote_corrupt_total"), corrupt)
        self.assertEqual(self.metric(self.b, "chunkfuse_remote_incomplete_total"), incomplete)
        self.assertGreater(self.metric(self.b, "chunkfuse_remote_hits_total"), remote_hits)


if __name__ == "__main__":
    unittest.main()

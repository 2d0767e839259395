"""End-to-end fault injection (issue 59): `chunkfuse serve` with its store on a small tmpfs
filled until ENOSPC through the API (chunk registration, knowledge-base uploads, completions
with new documents), then topped off with a filler file. Every route must still answer 2xx or
4xx (507 or 503 with a message where a write was refused; never 500, never a crash), nothing
stored before is lost, and the server recovers once space returns.
Run: .venv-serve/bin/python -m unittest tests/serve_e2e/test_full_disk.py -v
"""
import errno
import json
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402
from test_store_startup import prose, tmpfs_wrapper  # noqa: E402

TMPFS_BYTES = 24 << 20  # five or so chunk caches of SmolLM2 (~4.5 MB each)


def fill(path):
    """Writes `path` until the file system says ENOSPC; returns the bytes written."""
    n = 0
    block = b"x" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n += f.write(block)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    # A page-sized hole may be left; take it too.
    with open(path, "ab", buffering=0) as f:
        try:
            while f.write(b"x"):
                n += 1
        except OSError:
            pass
    return n


class FullDiskTest(unittest.TestCase):
    """On ENOSPC the knowledge base erased a chunk in memory, then failed to rewrite
    serve-chunks.json and kept a document with erased ids (later listings answered 500), a
    registration answered 500 with the chunk already registered in memory, and the knowledge
    base's worker had no try around its engine calls (an escaping exception ends the process)."""

    def setUp(self):
        self.statuses = []

    def call(self, method, path, body=None):
        status, reply = self.server.request(method, path, body)
        self.statuses.append((status, method, path))
        self.assertNotEqual(status, 500, (method, path, reply))
        self.assertIsNone(self.server.proc.poll(), "the server died on %s %s" % (method, path))
        if status == 507:  # a refused write says why
            self.assertIn("disk", reply["error"]["message"], reply)
        elif status >= 500:
            self.assertEqual(status, 503, reply)
            self.assertTrue(reply["error"]["message"], reply)
        return status, reply

    def listings(self):
        out = {}
        for path in ("/v1/documents", "/v1/knowledge/chunks"):
            status, body = self.call("GET", path)
            self.assertEqual(status, 200, body)
            out[path] = {x["id"]: x.get("state", x.get("status")) for x in body["data"]}
        return out

    def chat(self, **extra):
        body = {"model": "m", "messages": [{"role": "user", "content": "Which passage?"}], "max_tokens": 2}
        body.update(extra)
        return self.call("POST", "/v1/chat/completions", body)

    def test_a_full_store_refuses_writes_loses_nothing_and_recovers(self):
        tmp = tempfile.mkdtemp(prefix="chunkfuse-full-")
        store = os.path.join(tmp, "store")
        os.makedirs(store)
        try:
            wrapper = tmpfs_wrapper(tmp, store, size=TMPFS_BYTES)
            if wrapper is None:
                self.skipTest("no tmpfs mount here (needs root or user namespaces)")
            self.server = h.Server("--disk-budget", "0", binary=wrapper, cache_dir=store)
            try:
                self.run_full_disk(os.path.join("/proc/%d/root" % self.server.proc.pid + store))
            finally:
                code, log = self.server.stop()
            self.assertEqual(code, 0, log)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def run_full_disk(self, root):
        # Stored before the disk fills: one registered chunk, two knowledge-base documents.
        status, reg = self.call("POST", "/v1/chunks", {"texts": [prose(900, 40)]})
        self.assertEqual(status, 200, reg)
        kept_id = reg["data"][0]["id"]
        for name, seed in (("kept.txt", 901), ("doomed.txt", 902)):
            status, d = self.call("POST", "/v1/documents", {"name": name, "text": prose(seed, 40)})
            self.assertEqual(status, 202, d)
        h.wait_documents_ready(self.server)
        before = self.listings()
        self.assertEqual(set(before["/v1/documents"].values()), {"ready"}, before)

        # Fill the store through the API (unbounded disk tier), then top it off.
        filled_ids = []
        for i in range(12):
            st = os.statvfs(root)
            if st.f_bavail * st.f_frsize < (2 << 20):
                break
            status, reply = self.call("POST", "/v1/chunks", {"texts": [prose(i, 180)]})
            if status == 200:
                filled_ids.append(reply["data"][0]["id"])
            self.chat(documents=[prose(100 + i, 120)], fusion={"method": "reuse"})
        filler = os.path.join(root, "filler")
        self.assertGreater(fill(filler) + 1, 0)
        with self.assertRaises(OSError):  # full: not even one more small file
            with open(os.path.join(root, "probe"), "wb", buffering=0) as f:
                f.write(b"y" * 4096)

        # Every route on a full disk: 2xx, 4xx, or 507/503 saying the disk is full.
        status, reply = self.call("POST", "/v1/chunks", {"texts": [prose(950, 40)]})
        self.assertIn(status, (200, 507), reply)
        refused_chunk = status == 507 and prose(950, 40)
        status, reply = self.call("POST", "/v1/documents", {"name": "late.txt", "text": prose(951, 40)})
        self.assertIn(status, (202, 507), reply)
        if status == 202:
            h.wait_documents_ready(self.server, timeout=60)
        self.assertEqual(self.chat(documents=[prose(952, 40)], fusion={"method": "reuse"})[0], 200)
        self.assertEqual(self.chat(documents=[{"id": kept_id}])[0], 200)
        self.assertEqual(self.chat(retrieval={"k": 2})[0], 200)
        self.assertEqual(self.call("POST", "/v1/retrieve", {"query": "river stone", "k": 2})[0], 200)
        for path in ("/v1/chunks/" + kept_id, "/health", "/metrics", "/v1/models", "/ui/"):
            self.assertEqual(self.call("GET", path)[0], 200, path)
        during = self.listings()
        for path, items in before.items():  # nothing already stored is lost
            for item_id, state in items.items():
                self.assertEqual(during[path].get(item_id), state, (path, item_id, during))
        doomed_doc = self.doc_id("doomed.txt")
        doomed = [c for c in during["/v1/knowledge/chunks"] if c.startswith(doomed_doc + "-")]
        status, reply = self.call("DELETE", "/v1/knowledge/chunks/" + doomed[0])
        self.assertIn(status, (200, 507), reply)
        after = self.listings()  # the delete's answer is what the listing says
        self.assertEqual(doomed[0] in after["/v1/knowledge/chunks"], status == 507, after)
        for path, items in before.items():
            for item_id in items:
                if not item_id.startswith(doomed_doc):
                    self.assertIn(item_id, after[path], (path, after))

        # Deleting a registered chunk on the full disk: done (its cache file goes first, which
        # makes the room the index rewrite needs) or 507 with the chunk still there.
        self.assertTrue(filled_ids, "no chunk was registered while the disk filled")
        status, reply = self.call("DELETE", "/v1/chunks/" + filled_ids[0])
        self.assertIn(status, (200, 507), reply)
        self.assertEqual(self.call("GET", "/v1/chunks/" + filled_ids[0])[0], 404 if status == 200 else 200)
        self.assertEqual(self.call("GET", "/v1/chunks/" + kept_id)[0], 200)

        # Space returns: writes succeed again, and what was refused can be sent again.
        os.unlink(filler)
        status, reply = self.call("POST", "/v1/chunks", {"texts": [refused_chunk or prose(960, 40)]})
        self.assertEqual(status, 200, reply)
        status, d = self.call("POST", "/v1/documents", {"name": "after.txt", "text": prose(961, 40)})
        self.assertEqual(status, 202, d)
        docs = h.wait_documents_ready(self.server, timeout=60)
        self.assertEqual({x["status"] for x in docs}, {"ready"}, docs)
        index = ""  # the index and the journal of registrations since it was last rewritten
        for name in ("serve-chunks.json", "serve-chunks.json.journal"):
            if os.path.exists(os.path.join(root, name)):
                with open(os.path.join(root, name)) as f:
                    index += f.read()
        self.assertIn(json.dumps(prose(900, 40))[1:-1], index)  # the index on disk kept the early chunk
        with open(os.path.join(root, "knowledge-base.json")) as f:
            saved = f.read()
        self.assertIn("kept.txt", saved)
        self.assertIn("after.txt", saved)
        refused = [s for s in self.statuses if s[0] >= 500]
        self.assertTrue(refused, "the disk never filled: nothing was refused")
        print("RELIABILITY full disk: %d requests, refused %s" % (len(self.statuses), refused))

    def doc_id(self, name):
        status, body = self.server.get("/v1/documents")
        return next(d["id"] for d in body["data"] if d["name"] == name)


if __name__ == "__main__":
    unittest.main()

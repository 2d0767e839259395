"""End-to-end: hostile clients against the real server on loopback (issue 17). Each test
reproduces one hole the hostile-client probe found and checks that it is closed: bounded
memory for any body encoding, a byte bound before tokenizing, deadlines and a cap for
connections, API keys, CORS and JSON-only POSTs. Every test is bounded in time; after each
class the server must still answer and have sent no 5xx.

Figures (peak RSS growth, wait under a connection flood) are printed with a "RELIABILITY"
prefix; README.md's RELIABILITY section quotes them.
"""
import concurrent.futures
import json
import os
import select
import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402

HELLO = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0}
MiB = 1 << 20


def report(what, value):
    print("RELIABILITY %s: %s" % (what, value), file=sys.stderr, flush=True)


def write_store_key(path, mode=0o600):
    """A store key file as the README says to make one: 64 hex digits, mode 0600 (issue 29 item 10)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    os.chmod(path, mode)  # whatever the umask
    return path


def status_of(reply):
    """The status code of a raw HTTP reply, or None when nothing (or no status line) came back."""
    if not reply.startswith(b"HTTP/1."):
        return None
    return int(reply.split(b" ", 2)[1])


def read_reply(sock, timeout):
    """Bytes the server sends until it closes, a full response has arrived, or timeout."""
    sock.settimeout(timeout)
    out = b""
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            got = sock.recv(65536)
            if not got:
                break
            out += got
            head, sep, body = out.partition(b"\r\n\r\n")
            if sep:
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]
                if length and len(body) >= length[0]:
                    break
    except (socket.timeout, ConnectionError):
        pass
    return out


def push_body(server, head, pieces, total):
    """Sends head, then pieces() until `total` bytes or the server answers or closes; returns
    (reply, bytes sent). The reply is read as soon as it is readable, as a real client would."""
    s = socket.create_connection(server.host_port(), timeout=30)
    sent = 0
    try:
        s.sendall(head)
        while sent < total:
            readable, _, _ = select.select([s], [], [], 0)
            if readable:
                break
            piece = pieces()
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        return read_reply(s, 15), sent
    finally:
        s.close()


class HostileBodyTest(unittest.TestCase):
    """Bodies and prompts: the server's default --max-body (8 MiB)."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--max-prompt-tokens", "512")

    @classmethod
    def tearDownClass(cls):
        m = cls.server.metrics()
        code, log = cls.server.stop()
        assert m['chunkfuse_http_responses_total{code="5xx"}'] == 0, m
        if code != 0:
            raise AssertionError("server exited with %s on SIGTERM:\n%s" % (code, log))

    def assert_alive(self):
        self.assertIsNone(self.server.proc.poll(), "server died:\n" + self.server.log_text())
        status, body = self.server.post("/v1/chat/completions", HELLO)
        self.assertEqual(status, 200, body)

    def test_chunked_50mb_body_is_refused_while_reading(self):
        _, peak_before = self.server.memory_kb()
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (64 * 1024, b"a" * 64 * 1024)
        t0 = time.time()
        reply, sent = push_body(self.server, head, lambda: chunk, 50 * MiB)
        _, peak_after = self.server.memory_kb()
        growth_mb = (peak_after - peak_before) / 1024
        report("chunked 50 MB body", "status %s after %.1f MB sent in %.2f s, peak RSS +%.1f MB"
               % (status_of(reply), sent / MiB, time.time() - t0, growth_mb))
        self.assertEqual(status_of(reply), 413, reply[:300])
        self.assertIn(b"larger than the limit", reply)
        self.assertLess(growth_mb, 100)
        self.assert_alive()

    def test_body_without_length_is_bounded(self):
        _, peak_before = self.server.memory_kb()
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n"
        reply, _ = push_body(self.server, head, lambda: b"b" * 65536, 30 * MiB)
        _, peak_after = self.server.memory_kb()
        self.assertEqual(status_of(reply), 413, reply[:300])
        self.assertLess((peak_after - peak_before) / 1024, 100)

    def test_declared_length_past_limit_is_refused_before_reading(self):
        s = socket.create_connection(self.server.host_port(), timeout=30)
        t0 = time.time()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 52428800\r\n\r\n{")
        reply = read_reply(s, 10)
        s.close()
        self.assertEqual(status_of(reply), 413, reply[:300])
        self.assertLess(time.time() - t0, 3)

    def test_other_routes_and_methods_never_buffer_a_body(self):
        chunk = b"%x\r\n%s\r\n" % (65536, b"c" * 65536)
        for method, path, want in [(b"PUT", b"/v1/chat/completions", 405), (b"PATCH", b"/v1/chunks", 405),
                                   (b"POST", b"/v1/nothing-here", 404), (b"DELETE", b"/v1/chunks/" + b"0" * 32, 404)]:
            with self.subTest(method=method, path=path):
                head = (b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" % (method, path))
                reply, sent = push_body(self.server, head, lambda: chunk, 40 * MiB)
                self.assertEqual(status_of(reply), want, reply[:300])
                self.assertLess(sent, 40 * MiB)

    def test_request_line_without_end_is_cut_off(self):
        _, peak_before = self.server.memory_kb()
        reply, sent = push_body(self.server, b"GET /", lambda: b"x" * 65536, 60 * MiB)
        _, peak_after = self.server.memory_kb()
        growth_mb = (peak_after - peak_before) / 1024
        report("60 MB request line", "closed after %.1f MB, peak RSS +%.1f MB" % (sent / MiB, growth_mb))
        self.assertLess(sent, 60 * MiB)
        self.assertLess(growth_mb, 100)
        self.assert_alive()

    def test_text_plain_post_is_refused(self):
        # A browser "simple request" from any web page: text/plain needs no preflight.
        status, body = self.server.request("POST", "/v1/chat/completions", body=HELLO,
                                           headers={"Content-Type": "text/plain"})
        self.assertEqual(status, 415, body)
        self.assertIn("application/json", body["error"]["message"])
        status, body = self.server.request("POST", "/v1/chunks", raw=b"texts=a",
                                           headers={"Content-Type": "application/x-www-form-urlencoded"})
        self.assertEqual(status, 415, body)

    def test_no_cors_headers_by_default(self):
        req = socket.create_connection(self.server.host_port(), timeout=30)
        req.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\n\r\n")
        reply = read_reply(req, 10)
        req.close()
        self.assertEqual(status_of(reply), 200, reply[:300])
        self.assertNotIn(b"access-control-allow-origin", reply.lower())

    def test_oversized_prompts_are_refused_before_tokenizing(self):
        # 8 parallel bodies of 7 MB, within --max-body: each fails the byte bound at once.
        body = json.dumps({"messages": [{"role": "user", "content": "word " * (7 * MiB // 5)}],
                           "max_tokens": 4}).encode()
        _, peak_before = self.server.memory_kb()
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _: self.server.post("/v1/chat/completions", raw=body), range(8)))
        elapsed = time.time() - t0
        _, peak_after = self.server.memory_kb()
        growth_mb = (peak_after - peak_before) / 1024
        report("8 parallel 7 MB prompts", "all %s in %.2f s, peak RSS +%.1f MB"
               % (sorted({s for s, _ in results}), elapsed, growth_mb))
        for status, reply in results:
            self.assertEqual(status, 413, reply)
            self.assertIn("cannot fit", reply["error"]["message"])
        self.assertLess(elapsed, 10)
        self.assertLess(growth_mb, 500)
        # A registration of one huge text is refused the same way.
        status, reply = self.server.post("/v1/chunks", {"texts": ["x" * (6 * MiB)]})
        self.assertEqual(status, 413, reply)


class HostileConnectionTest(unittest.TestCase):
    """Slow and idle connections: short deadlines so that the test stays quick."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--request-timeout", "3", "--keep-alive-timeout", "2",
                              "--api-key", "conn-key", "--metrics-public", api_key="conn-key")

    @classmethod
    def tearDownClass(cls):
        m = cls.server.metrics()
        code, log = cls.server.stop()
        assert m['chunkfuse_http_responses_total{code="5xx"}'] == 0, m
        if code != 0:
            raise AssertionError("server exited with %s on SIGTERM:\n%s" % (code, log))

    def wait_open_below(self, n, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.server.metrics()["chunkfuse_http_connections_open"] <= n:
                return
            time.sleep(0.2)
        self.fail("connections still open after %d s" % timeout)

    def timed_request(self):
        t0 = time.time()
        status, body = self.server.post("/v1/chat/completions", HELLO)
        self.assertEqual(status, 200, body)
        return time.time() - t0

    def test_metrics_public_without_key(self):
        status, text = self.server.request("GET", "/metrics", headers={"Authorization": None})
        self.assertEqual(status, 200, text)
        status, body = self.server.request("GET", "/v1/models", headers={"Authorization": None})
        self.assertEqual(status, 401, body)

    def test_trickling_headers_are_cut_at_the_deadline(self):
        before = self.server.metrics()["chunkfuse_http_connection_timeouts_total"]
        s = socket.create_connection(self.server.host_port(), timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        t0 = time.time()
        closed_after = None
        while time.time() - t0 < 15:
            try:
                s.sendall(b"X")
                readable, _, _ = select.select([s], [], [], 0.5)
                if readable and not s.recv(4096):
                    closed_after = time.time() - t0
                    break
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.time() - t0
                break
        s.close()
        self.assertIsNotNone(closed_after, "a client trickling headers was never cut off")
        self.assertLess(closed_after, 3 + 2 + 1.5)  # request + keep-alive timeouts + watchdog tick
        self.assertGreater(self.server.metrics()["chunkfuse_http_connection_timeouts_total"], before)

    def test_valid_request_waits_little_behind_100_slow_connections(self):
        self.wait_open_below(1)  # the /metrics call's own connection
        self.timed_request()  # warm
        normal = min(self.timed_request() for _ in range(3))
        stop = threading.Event()
        slow = []
        for _ in range(100):
            s = socket.create_connection(self.server.host_port(), timeout=30)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            slow.append(s)

        def trickle():
            while not stop.is_set():
                for s in slow:
                    try:
                        s.sendall(b"Y")
                    except OSError:
                        pass
                stop.wait(1.0)

        t = threading.Thread(target=trickle)
        t.start()
        try:
            time.sleep(1.0)
            waits = [self.timed_request() for _ in range(3)]
        finally:
            stop.set()
            t.join()
            for s in slow:
                s.close()
        report("valid request behind 100 slow connections",
               "%.3f s worst of 3 (normal %.3f s)" % (max(waits), normal))
        self.assertLess(max(waits), normal + 2.0)



class ConnectionCapTest(unittest.TestCase):
    """A small cap, so that the test fills it quickly."""

    CAP = 8

    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--max-connections", str(cls.CAP))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def test_connections_past_the_cap_get_503_at_once(self):
        before = self.server.metrics()["chunkfuse_http_connections_refused_total"]

        def hold():
            s = socket.create_connection(self.server.host_port(), timeout=30)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
            return s

        held = [hold() for _ in range(self.CAP)]
        try:
            # On a loaded machine the server may not have accepted every held connection yet
            # (they wait in the listen backlog, uncounted): an extra one then still fits. And a
            # held one that arrived while a slot was still taken by an earlier request's
            # connection got a 503 itself: it holds nothing. Each try replaces those (readable:
            # answered or closed) before the extra one; past the cap that one must get its 503
            # at once.
            deadline = time.time() + 15
            while True:
                time.sleep(0.5)
                answered, _, _ = select.select(held, [], [], 0)
                for s in answered:
                    s.close()
                    held[held.index(s)] = hold()
                if answered:
                    report("held connections answered before the extra one, replaced", len(answered))
                    self.assertLess(time.time(), deadline, "held connections kept being answered: the "
                                    "server refuses below the cap or times out idle headers early")
                    continue
                t0 = time.time()
                extra = socket.create_connection(self.server.host_port(), timeout=30)
                extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                reply = read_reply(extra, 5)
                extra.close()
                if status_of(reply) != 200 or time.time() > deadline:
                    break
            report("connection past the cap", "status %s in %.3f s" % (status_of(reply), time.time() - t0))
            self.assertEqual(status_of(reply), 503, reply[:300])
            self.assertIn(b"too_many_connections", reply)
            self.assertLess(time.time() - t0, 1.0)
        finally:
            for s in held:
                s.close()
        deadline = time.time() + 10
        while time.time() < deadline:  # the held threads see end-of-file and free their slots
            try:
                if self.server.get("/health")[0] == 200:
                    break
            except OSError:  # refused while the slots free: the reset may beat the 503
                pass
            time.sleep(0.1)
        self.assertGreater(self.server.metrics()["chunkfuse_http_connections_refused_total"], before)
        status, body = self.server.post("/v1/chat/completions", HELLO)
        self.assertEqual(status, 200, body)


class AccessTest(unittest.TestCase):
    """API keys (flag and file), the openai client, CORS for one origin."""

    @classmethod
    def setUpClass(cls):
        cls.key_file = tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False)
        cls.key_file.write("# team keys\nkey-two\n\n")
        cls.key_file.close()
        cls.server = h.Server("--api-key", "key-one", "--api-key-file", cls.key_file.name,
                              "--cors-origin", "https://app.example", api_key="key-one")

    @classmethod
    def tearDownClass(cls):
        m = cls.server.metrics()
        code, log = cls.server.stop()
        os.unlink(cls.key_file.name)
        assert m['chunkfuse_http_responses_total{code="5xx"}'] == 0, m
        if code != 0:
            raise AssertionError("server exited with %s on SIGTERM:\n%s" % (code, log))

    def call(self, method, path, key, body=None, headers=None):
        hdrs = {"Authorization": ("Bearer " + key) if key is not None else None}
        hdrs.update(headers or {})
        return self.server.request(method, path, body=body, headers=hdrs)

    def test_keys_are_required_except_for_health(self):
        before = self.server.metrics()["chunkfuse_http_unauthorized_total"]
        for key in [None, "", "key-on", "key-one-", "KEY-ONE"]:
            for method, path, body in [("GET", "/v1/models", None), ("GET", "/metrics", None),
                                       ("POST", "/v1/chat/completions", HELLO), ("GET", "/v1/chunks/abc", None),
                                       ("DELETE", "/v1/chunks/abc", None)]:
                with self.subTest(key=key, path=path, method=method):
                    status, reply = self.call(method, path, key, body)
                    self.assertEqual(status, 401, reply)
                    self.assertEqual(reply["error"]["code"], "invalid_api_key")
                    self.assertEqual(reply["error"]["type"], "invalid_request_error")
        status, reply = self.call("GET", "/health", None)
        self.assertEqual((status, reply["status"]), (200, "ok"))
        for key in ["key-one", "key-two"]:
            status, reply = self.call("GET", "/v1/models", key)
            self.assertEqual(status, 200, reply)
        status, _ = self.call("GET", "/v1/models", None, headers={"Authorization": "bearer key-two"})
        self.assertEqual(status, 200)
        self.assertGreaterEqual(self.server.metrics()["chunkfuse_http_unauthorized_total"] - before, 25)

    def test_unauthenticated_body_is_never_read(self):
        head = (b"POST /v1/chunks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b"d" * 65536)
        reply, sent = push_body(self.server, head, lambda: chunk, 40 * MiB)
        self.assertEqual(status_of(reply), 401, reply[:300])
        self.assertLess(sent, 40 * MiB)

    def test_openai_client_with_and_without_the_key(self):
        import openai
        client = h.openai_client(self.server)
        out = client.chat.completions.create(model="any", **HELLO)
        self.assertTrue(out.choices[0].message.content)
        wrong = openai.OpenAI(base_url=self.server.url + "/v1", api_key="nope", max_retries=0, timeout=60)
        with self.assertRaises(openai.AuthenticationError):
            wrong.chat.completions.create(model="any", **HELLO)

    def test_cors_for_the_listed_origin_only(self):
        status, _ = self.call("GET", "/v1/models", "key-one", headers={"Origin": "https://app.example"})
        self.assertEqual(status, 200)
        s = socket.create_connection(self.server.host_port(), timeout=30)
        s.sendall(b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://app.example\r\n"
                  b"Access-Control-Request-Method: POST\r\n"
                  b"Access-Control-Request-Headers: authorization, content-type\r\n\r\n")
        reply = read_reply(s, 5)
        s.close()
        self.assertEqual(status_of(reply), 204, reply[:300])
        reply = reply.lower()
        self.assertIn(b"access-control-allow-origin: https://app.example", reply)
        self.assertIn(b"authorization", reply)
        for origin, allowed in [(b"https://app.example", True), (b"https://evil.example", False)]:
            s = socket.create_connection(self.server.host_port(), timeout=30)
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer key-one\r\nOrigin: %s\r\n\r\n"
                      % origin)
            reply = read_reply(s, 5)
            s.close()
            self.assertEqual(status_of(reply), 200, reply[:300])
            reply = reply.lower()
            self.assertEqual(b"access-control-allow-origin" in reply, allowed, reply[:400])


class IsolateKeysTest(unittest.TestCase):
    """--isolate-keys: a key sees only the chunks it registered and no cache-use figures."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.Server("--api-key", "tenant-a", "--api-key", "tenant-b", "--isolate-keys", api_key="tenant-a")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def as_key(self, key, method, path, body=None):
        return self.server.request(method, path, body=body, headers={"Authorization": "Bearer " + key})

    def test_documents_and_hits_are_private_to_a_key(self):
        text = "Marie Curie won Nobel prizes in physics (1903) and chemistry (1911)."
        status, reg = self.as_key("tenant-a", "POST", "/v1/chunks", {"texts": [text]})
        self.assertEqual(status, 200, reg)
        cid = reg["data"][0]["id"]
        ask = dict(HELLO, messages=[{"role": "user", "content": "Which prizes did she win?"}],
                   documents=[{"id": cid}], fusion={"method": "reuse"})
        status, own = self.as_key("tenant-a", "POST", "/v1/chat/completions", ask)
        self.assertEqual(status, 200, own)
        self.assertNotIn("chunk_hits", own["chunkfuse"])
        self.assertEqual(own["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        # Another key: the id does not exist for it, whatever it tries.
        for method, path, body in [("GET", "/v1/chunks/" + cid, None), ("DELETE", "/v1/chunks/" + cid, None),
                                   ("POST", "/v1/chat/completions", ask)]:
            with self.subTest(method=method, path=path):
                status, reply = self.as_key("tenant-b", method, path, body)
                self.assertEqual(status, 404, reply)
        # An inline copy of the same text: answered, but nothing says it was cached already.
        inline = dict(ask, documents=[text])
        status, other = self.as_key("tenant-b", "POST", "/v1/chat/completions", inline)
        self.assertEqual(status, 200, other)
        self.assertNotIn("chunk_hits", other["chunkfuse"])
        self.assertNotIn("prefix_hit_tokens", other["chunkfuse"])
        self.assertEqual(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        # Registering the same text makes it b's too; b's delete leaves a's copy.
        status, _ = self.as_key("tenant-b", "POST", "/v1/chunks", {"texts": [text]})
        self.assertEqual(status, 200)
        self.assertEqual(self.as_key("tenant-b", "GET", "/v1/chunks/" + cid)[0], 200)
        self.assertEqual(self.as_key("tenant-b", "DELETE", "/v1/chunks/" + cid)[0], 200)
        self.assertEqual(self.as_key("tenant-b", "GET", "/v1/chunks/" + cid)[0], 404)
        status, chunk = self.as_key("tenant-a", "GET", "/v1/chunks/" + cid)
        self.assertEqual((status, chunk.get("text")), (200, text))
        self.assertEqual(self.as_key("tenant-a", "DELETE", "/v1/chunks/" + cid)[0], 200)
        self.assertEqual(self.as_key("tenant-a", "GET", "/v1/chunks/" + cid)[0], 404)


class StoreKeyTest(unittest.TestCase):
    """--store-key-file: a cache entry without a valid HMAC tag (here: written under another
    key, as anyone who can write the store but lacks the key would) is never served."""

    def test_entries_of_another_key_are_recomputed_not_served(self):
        tmp = tempfile.mkdtemp(prefix="chunkfuse-storekey-")
        store = os.path.join(tmp, "store")
        keys = []
        for name in ["right", "other"]:
            keys.append(write_store_key(os.path.join(tmp, name)))
        doc = "The Eiffel Tower is in Paris. It was finished in 1889 for the World's Fair."
        body = dict(HELLO, messages=[{"role": "user", "content": "When was the tower finished?"}],
                    documents=[doc], fusion={"method": "reuse"})

        def run(key_file, want_hits):
            server = h.Server("--store-key-file", key_file, cache_dir=store)
            try:
                status, reply = server.post("/v1/chat/completions", body)
                self.assertEqual(status, 200, reply)
                self.assertEqual(reply["chunkfuse"]["chunk_hits"], want_hits, reply["chunkfuse"])
                return server.metrics()
            finally:
                code, log = server.stop()
                self.assertEqual(code, 0, log)

        run(keys[1], 0)          # written under the other key
        m = run(keys[0], 0)      # refused: computed again, not served
        self.assertEqual(m['chunkfuse_store_refused_entries_total{reason="unauthenticated"}'], 1)
        m = run(keys[0], 1)      # its own entry is served
        self.assertEqual(m['chunkfuse_store_refused_entries_total{reason="unauthenticated"}'], 0)
        for root, dirs, files in os.walk(store):
            for d in dirs:
                self.assertEqual(os.stat(os.path.join(root, d)).st_mode & 0o777, 0o700, d)
            for f in files:
                self.assertEqual(os.stat(os.path.join(root, f)).st_mode & 0o777, 0o600, f)
        shutil.rmtree(tmp, ignore_errors=True)


class StorePathsTest(unittest.TestCase):
    """Issue 29 items 8, 10, 11: ids from the URL never name a path outside the store, the
    store key file must be private, and the registered-chunk index is never written through a
    planted link."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="chunkfuse-paths-")
        cls.store = os.path.join(cls.tmp, "store")
        os.makedirs(cls.store)
        # What `DELETE /v1/chunks/..x` removed before: ..x.cfkv in the folder above the store.
        cls.above = os.path.join(cls.tmp, "..x.cfkv")
        with open(cls.above, "w") as f:
            f.write("not the store's")
        # A link at the old fixed temp name of the index, pointing outside the store.
        cls.target = os.path.join(cls.tmp, "precious.txt")
        with open(cls.target, "w") as f:
            f.write("keep me")
        os.symlink(cls.target, os.path.join(cls.store, "serve-chunks.json.tmp"))
        cls.server = h.Server(cache_dir=cls.store)

    @classmethod
    def tearDownClass(cls):
        m = cls.server.metrics()
        code, log = cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert code == 0, log
        assert m['chunkfuse_http_responses_total{code="5xx"}'] == 0, m

    def test_malformed_chunk_ids_are_400_and_name_nothing(self):
        for method in ["DELETE", "GET"]:
            for bad in ["..x", "..", "%2e%2ex", "%00" + "0" * 31, "A" * 32, "0" * 31, "0" * 33, "x" * 300]:
                status, reply = self.server.request(method, "/v1/chunks/" + bad)
                self.assertEqual(status, 400, (method, bad, reply))
                self.assertEqual(reply["error"]["type"], "invalid_request_error", reply)
                self.assertEqual(reply["error"]["param"], "id", reply)
                self.assertIn("not a chunk id", reply["error"]["message"])
        status, reply = self.server.request("DELETE", "/v1/chunks/..x")
        self.assertIn("'..x'", reply["error"]["message"])
        report("DELETE /v1/chunks/..x", "%d %s" % (status, reply["error"]["message"]))
        self.assertTrue(os.path.exists(self.above), "the file above the store was removed")
        # A well-formed id the server does not know: 404, as before.
        for method in ["DELETE", "GET"]:
            status, reply = self.server.request(method, "/v1/chunks/" + "0" * 32)
            self.assertEqual(status, 404, reply)

    def test_the_chunk_index_is_never_written_through_a_link(self):
        status, reply = self.server.post("/v1/chunks", {"texts": ["Paris is the capital of France."]})
        self.assertEqual(status, 200, reply)
        with open(self.target) as f:
            self.assertEqual(f.read(), "keep me")
        index = os.path.join(self.store, "serve-chunks.json")
        self.assertFalse(os.path.islink(index))
        self.assertEqual(os.stat(index).st_mode & 0o777, 0o600)
        with open(index) as f:
            self.assertIn("Paris", f.read())
        self.assertTrue(os.path.islink(os.path.join(self.store, "serve-chunks.json.tmp")))  # left alone

    def test_a_store_key_file_must_be_private_and_long_enough(self):
        cases = [("open", 0o644, None, "group or others"),
                 ("short", 0o600, b"abcdefghijklmnop\n", "16 bytes")]
        for name, mode, content, want in cases:
            path = write_store_key(os.path.join(self.tmp, name + ".key"), mode)
            if content is not None:
                with open(path, "wb") as f:
                    f.write(content)
            proc = h.subprocess.run([h.binary_path(), "serve", "-m", h.model_path(), "--port", "0",
                                     "--cache-dir", os.path.join(self.tmp, "s-" + name), "--store-key-file", path],
                                    capture_output=True, text=True, timeout=120)
            self.assertNotEqual(proc.returncode, 0, name)
            self.assertIn(want, proc.stderr + proc.stdout, name)
            report("store key file " + name, (proc.stderr + proc.stdout).strip().splitlines()[-1])
        link = os.path.join(self.tmp, "link.key")
        os.symlink(write_store_key(os.path.join(self.tmp, "real.key")), link)
        proc = h.subprocess.run([h.binary_path(), "serve", "-m", h.model_path(), "--port", "0",
                                 "--cache-dir", os.path.join(self.tmp, "s-link"), "--store-key-file", link],
                                capture_output=True, text=True, timeout=120)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("symlink", proc.stderr + proc.stdout)


if __name__ == "__main__":
    unittest.main()

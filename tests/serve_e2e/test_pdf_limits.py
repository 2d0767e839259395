"""End-to-end: PDF uploads of the knowledge base run `pdftotext` (Debian's poppler-utils,
installed by scripts/setup.sh) under limits (issue 59): a CPU limit (RLIMIT_CPU) beside the
wall-clock deadline, an address-space limit (RLIMIT_AS), the output cap, and at most
--pdf-jobs of them at once. The PDFs are made here: a page of text followed by millions of
no-op operators ("q Q"), deflated (~25 KB), which keep pdftotext busy for a second or two.
Run: .venv-serve/bin/python -m unittest tests/serve_e2e/test_pdf_limits.py -v
"""
import base64
import os
import sys
import threading
import time
import unittest
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402


def busy_pdf(no_ops, line="A heavy page about copper lanterns."):
    """A one-page PDF whose deflated content stream shows `line`, then runs `no_ops` no-ops."""
    content = b"BT /F1 11 Tf 50 750 Td (" + line.encode() + b") Tj ET\n" + b"q Q " * no_ops
    data = zlib.compress(content, 9)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> >> >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(data) + data + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out = b"%PDF-1.4\n"
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return out


def children_named(pid, name):
    """Pids of the live children of `pid` whose command is `name`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == pid and comm == name:
            out.append(int(entry))
    return out


def limits_of(pid):
    """{'Max cpu time': soft limit, ...} from /proc/<pid>/limits; {} once it is gone."""
    try:
        with open("/proc/%d/limits" % pid) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return {}
    return {line[:26].strip(): line[26:].split()[0] for line in lines}


class PdfLimitsTest(unittest.TestCase):
    def upload(self, server, pdf, name="busy.pdf"):
        status, body = server.post("/v1/documents", {"name": name,
                                                     "content_base64": base64.b64encode(pdf).decode()})
        self.assertNotEqual(status, 500, body)
        if status >= 400:
            self.assertTrue(body["error"]["message"], body)
        return status, body

    def test_concurrent_uploads_run_capped_and_limited(self):
        """Before: every upload started its own pdftotext at once, each without a CPU or memory
        limit (only the 15 s wall-clock deadline and the output cap)."""
        server = h.Server()
        try:
            pdf = busy_pdf(3_000_000)
            results, seen, limits = [], set(), {}
            most = [0]
            done = threading.Event()

            def sample():
                while not done.is_set():
                    kids = children_named(server.proc.pid, "pdftotext")
                    most[0] = max(most[0], len(kids))
                    for k in kids:
                        if k not in seen and limits_of(k):
                            seen.add(k)
                            limits.update(limits_of(k))
                    time.sleep(0.01)

            sampler = threading.Thread(target=sample)
            sampler.start()
            t0 = time.time()
            threads = [threading.Thread(target=lambda: results.append(self.upload(server, pdf)))
                       for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            elapsed = time.time() - t0
            done.set()
            sampler.join()
            statuses = sorted(s for s, _ in results)
            print("RELIABILITY pdf: 6 parallel uploads -> %s in %.1f s, at most %d pdftotext at once, limits %s"
                  % (statuses, elapsed, most[0], limits))
            self.assertEqual(len(results), 6, "an upload hung")
            self.assertTrue(set(statuses) <= {202, 503}, results)
            self.assertIn(202, statuses)
            self.assertGreater(most[0], 0, "never saw pdftotext run")
            self.assertLessEqual(most[0], 2, "more pdftotext processes at once than --pdf-jobs (2)")
            self.assertEqual(limits.get("Max cpu time"), "15", limits)
            self.assertEqual(limits.get("Max address space"), str(512 << 20), limits)
            h.wait_documents_ready(server)
        finally:
            code, log = server.stop()
        self.assertEqual(code, 0, log)

    def test_a_pdf_past_its_limits_is_refused_clearly_and_quickly(self):
        server = h.Server("--pdf-memory", "8MiB")
        try:
            t0 = time.time()
            status, body = self.upload(server, h.make_pdf(["A short page."]), name="small.pdf")
            self.assertIn(status, (400, 413), body)
            self.assertIn("8 MiB of memory", body["error"]["message"])
            self.assertLess(time.time() - t0, 10)
        finally:
            code, log = server.stop()
        self.assertEqual(code, 0, log)
        server = h.Server("--pdf-timeout-ms", "300")
        try:
            t0 = time.time()
            status, body = self.upload(server, busy_pdf(10_000_000))
            self.assertEqual(status, 400, body)  # the wall-clock deadline comes before the CPU limit (1 s)
            self.assertIn("too long", body["error"]["message"])
            self.assertLess(time.time() - t0, 10)
            # Within its limits a PDF is read as before.
            status, body = self.upload(server, h.make_pdf(["A short page about otters."]), name="ok.pdf")
            self.assertEqual(status, 202, body)
            docs = h.wait_documents_ready(server)
            self.assertEqual([d["status"] for d in docs if d["name"] == "ok.pdf"], ["ready"], docs)
        finally:
            code, log = server.stop()
        self.assertEqual(code, 0, log)


if __name__ == "__main__":
    unittest.main()

"""Starts the real `chunkfuse serve` on loopback for the end-to-end tests.

Environment: CHUNKFUSE_BIN (the binary; default build/chunkfuse under the repository),
CHUNKFUSE_MODEL (the GGUF; default the setup script's cache location), CHUNKFUSE_E2E_THREADS
(compute threads of the server, default 2).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def binary_path():
    return os.environ.get("CHUNKFUSE_BIN", os.path.join(REPO, "build", "chunkfuse"))


def model_path():
    # Same rule as scripts/lib.sh and src/base/paths.cpp.
    if os.environ.get("CHUNKFUSE_MODEL"):
        return os.environ["CHUNKFUSE_MODEL"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/tmp"), ".cache")
    return os.path.join(cache, "chunkfuse", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def threads():
    return int(os.environ.get("CHUNKFUSE_E2E_THREADS", "2"))


class Server:
    """One server process on a free port with its own temporary store; stop() ends it with
    SIGTERM and checks that it shut down cleanly."""

    def __init__(self, *extra_args, binary=None, model=None, n_threads=None, api_key=None, cache_dir=None):
        self.api_key = api_key  # sent as a Bearer token by request() when set
        self.tmp = tempfile.mkdtemp(prefix="chunkfuse-e2e-")
        self.cache_dir = cache_dir or os.path.join(self.tmp, "store")
        self.log_path = os.path.join(self.tmp, "server.log")
        self.log = open(self.log_path, "w+")
        cmd = [binary or binary_path(), "serve", "-m", model or model_path(), "-t", str(n_threads or threads()),
               "--port", "0", "--cache-dir", self.cache_dir, *extra_args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self.url = self._wait_for_url(timeout=60)
            self._wait_healthy(timeout=30)
        except BaseException:  # a refused or hung start: no process, file or folder left behind
            self.stop()
            raise

    def _wait_for_url(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited with %d:\n%s" % (self.proc.returncode, self.log_text()))
            m = re.search(r"listening on (http://[\d.]+:\d+)", self.log_text())
            if m:
                return m.group(1)
            time.sleep(0.05)
        raise RuntimeError("server did not start in %ds:\n%s" % (timeout, self.log_text()))

    def _wait_healthy(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                status, body = self.get("/health")
                if status == 200 and body.get("status") == "ok":
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server never became healthy:\n" + self.log_text())

    def log_text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def request(self, method, path, body=None, raw=None, timeout=120, headers=None):
        """(status, parsed JSON or text) for one request; errors are returned, not raised."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"Content-Type": "application/json"}
        if self.api_key:
            hdrs["Authorization"] = "Bearer " + self.api_key
        hdrs.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={k: v for k, v in hdrs.items() if v is not None})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, text, ctype = resp.status, resp.read().decode(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, text, ctype = e.code, e.read().decode(), e.headers.get("Content-Type", "")
        return status, (json.loads(text) if "json" in ctype else text)

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body=None, raw=None):
        return self.request("POST", path, body=body, raw=raw)

    def metrics(self):
        """The /metrics samples as {'name{labels}': value}."""
        status, text = self.get("/metrics")
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop_cleanly(self):
        """stop(), and an AssertionError with the server's log unless it exited 0 on SIGTERM."""
        code, log = self.stop()
        if code != 0:
            raise AssertionError("server exited with %s on SIGTERM:\n%s" % (code, log))
        return log

    def host_port(self):
        host, port = self.url[len("http://"):].split(":")
        return host, int(port)

    def memory_kb(self):
        """(current RSS, peak RSS) of the server process in KiB, from /proc."""
        fields = {}
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        code = self.proc.returncode
        with open(self.log_path) as f:
            log = f.read()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return code, log


def openai_client(server):
    import openai  # from .venv-serve (scripts/setup.sh)
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "unused", max_retries=0, timeout=120)


def make_pdf(lines):
    """A small valid one-page PDF showing `lines` (ASCII) in Helvetica, for upload tests:
    the objects, then an xref table with their byte offsets (PDF 1.4, section 7.5)."""
    def esc(s):
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    text = "BT /F1 11 Tf 50 750 Td 14 TL " + " ".join("(%s) '" % esc(l) for l in lines) + " ET"
    objs = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        "/Resources << /Font << /F1 5 0 R >> >> >>",
        "<< /Length %d >>\nstream\n%s\nendstream" % (len(text), text),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += ("%d 0 obj\n%s\nendobj\n" % (i, body)).encode()
    xref = len(out)
    out += ("xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)).encode()
    for off in offsets:
        out += ("%010d 00000 n \n" % off).encode()
    out += ("trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)).encode()
    return out


def wait_documents_ready(server, timeout=120):
    """Polls GET /v1/documents until no document is precomputing; returns the list."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, body = server.get("/v1/documents")
        assert status == 200, body
        if all(d["status"] != "precomputing" for d in body["data"]):
            return body["data"]
        time.sleep(0.2)
    raise AssertionError("documents still precomputing after %ds" % timeout)

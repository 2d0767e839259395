"""A real redis-server on a free loopback port for the end-to-end tests, driven with
redis-cli (both from Debian's redis-server package, installed by scripts/setup.sh)."""
import os
import shutil
import socket
import subprocess
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, port=None):
        self.port = port or free_port()
        self.tmp = tempfile.mkdtemp(prefix="chunkfuse-redis-")
        self.proc = None
        self.start()

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.port

    @property
    def store_key_file(self):
        """The store key every replica of this tier shares (a remote tier needs one, issue 17)."""
        path = os.path.join(self.tmp, "store.key")
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:  # 64 hex digits, mode 0600 (issue 29 item 10)
                f.write(os.urandom(32).hex() + "\n")
        return path

    def replica_args(self):
        """`chunkfuse serve` / `chunks precompute` arguments for a replica of this tier."""
        return ("--remote", self.url, "--store-key-file", self.store_key_file)

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.tmp, "--logfile", os.path.join(self.tmp, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited with %d" % self.proc.returncode)
            try:
                if self.cli("PING") == "PONG":
                    return
            except subprocess.SubprocessError:
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer in 10 s")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self):
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def cli(self, *args):
        """One command; its reply as text (raw: no quoting)."""
        out = subprocess.run(["redis-cli", "-p", str(self.port), "--raw", *[str(a) for a in args]],
                             capture_output=True, timeout=10, check=True)
        return out.stdout.decode("latin-1").rstrip("\n")

    def keys(self, pattern):
        text = self.cli("KEYS", pattern)
        return [k for k in text.split("\n") if k]

    def manifests(self):
        """chunk id -> manifest key of every committed entry."""
        return {k[len("chunkfuse:v2:{"):-1]: k for k in self.keys("chunkfuse:v2:{*}")}

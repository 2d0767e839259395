"""End-to-end: what `chunkfuse serve` does with what it finds in its store folder at start-up
(issue 59): temp files a killed writer left behind are removed (only ours, only stale), and the
disk tier has a default budget, shown in `serve --help`.
Run: .venv-serve/bin/python -m unittest tests/serve_e2e/test_store_startup.py -v
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402


def dead_pid():
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def touch(path, age_s):
    with open(path, "w") as f:
        f.write("half a write")
    t = time.time() - age_s
    os.utime(path, (t, t))


class StaleTempFilesTest(unittest.TestCase):
    """A kill -9 between write_private_file_atomic's create and rename (kv/store_paths.h) leaves
    ".<name>.tmp.<pid>.<16 hex>" beside the file; nothing removed them, so every crash kept its
    half-written cache file (megabytes each) forever."""

    def test_stale_temp_files_of_ours_are_removed_at_start(self):
        tmp = tempfile.mkdtemp(prefix="chunkfuse-temps-")
        store = os.path.join(tmp, "store")
        os.makedirs(os.path.join(store, "ab"))
        pid = dead_pid()
        stale = [os.path.join(store, ".serve-chunks.json.tmp.%d.0123456789abcdef" % pid),
                 os.path.join(store, ".knowledge-base.json.tmp.%d.fedcba9876543210" % pid),
                 os.path.join(store, "ab", ".ab%s.cfkv.tmp.%d.00000000deadbeef" % ("0" * 30, pid))]
        kept = [os.path.join(store, "serve-chunks.json.tmp"),              # not our pattern
                os.path.join(store, ".notes.tmp.%d.xyz" % pid),             # not our pattern
                os.path.join(store, "ab", ".x.cfkv.tmp.1.0123456789abcdef"),  # pid 1 is alive
                os.path.join(tmp, ".outside.tmp.%d.0123456789abcdef" % pid)]  # not in the store
        for p in stale + kept:
            touch(p, age_s=3600)
        fresh = os.path.join(store, ".new.cfkv.tmp.%d.0123456789abcdef" % pid)
        touch(fresh, age_s=-3600)  # written after start-up (another writer's clock): kept
        server = h.Server(cache_dir=store)
        try:
            log = server.log_text()
            for p in stale:
                self.assertFalse(os.path.exists(p), p)
            for p in kept + [fresh]:
                self.assertTrue(os.path.exists(p), p)
            self.assertIn("removed 3 stale temp files", log)
        finally:
            code, log = server.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        self.assertEqual(code, 0, log)


TMPFS_BYTES = 64 << 20
WORDS = ("river stone lantern orchard copper meadow harbor violet thunder saddle ember glacier whistle "
         "canyon pepper marble falcon willow quarry beacon").split()


def prose(seed, n_words):
    """Distinct plain text of about n_words words (a chunk of its own)."""
    x = seed * 2654435761 % 2**32
    out = ["Passage %d." % seed]
    for _ in range(n_words):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(WORDS[x % len(WORDS)])
    return " ".join(out) + "."


def tmpfs_wrapper(tmp, mount_at, size=TMPFS_BYTES):
    """A script that runs `chunkfuse ARGS` in a mount namespace of its own with a tmpfs of
    `size` bytes (64 MiB) at `mount_at` (the store): a small file system without touching the
    machine's. None when this machine allows no such mount (neither root nor user namespaces)."""
    probe = os.path.join(tmp, "probe")
    os.makedirs(probe)
    mount = "mount -t tmpfs -o size=%d none" % size
    if subprocess.run(["unshare", "-rm", "sh", "-c", mount + ' "$0"', probe], capture_output=True).returncode != 0:
        return None
    path = os.path.join(tmp, "chunkfuse-on-tmpfs")
    with open(path, "w") as f:
        f.write('#!/bin/sh\nexec unshare -rm sh -c \'%s "$0" && exec "$@"\' "%s" "%s" "$@"\n'
                % (mount, mount_at, os.path.abspath(h.binary_path())))
    os.chmod(path, 0o755)
    return path


def files_bytes(folder):
    """Bytes of the regular files under `folder`; None when it cannot be read."""
    if not os.path.isdir(folder):
        return None
    total = 0
    for root, _, files in os.walk(folder):
        total += sum(os.lstat(os.path.join(root, f)).st_size for f in files)
    return total


class DefaultDiskBudgetTest(unittest.TestCase):
    """The disk tier had no budget unless one was set in code (serve had no option): every new
    document's cache files stayed until the file system was full."""

    def test_help_shows_the_default(self):
        out = subprocess.run([h.binary_path(), "serve", "--help"], capture_output=True, text=True).stdout
        self.assertIn("--disk-budget", out)
        self.assertIn("half the free space on the store's file system", out)
        self.assertIn("10GiB", out)

    def test_help_shows_the_conversation_budget(self):
        out = subprocess.run([h.binary_path(), "serve", "--help"], capture_output=True, text=True).stdout
        self.assertIn("--conversation-budget", out)
        self.assertIn("128MiB", out)

    def test_a_default_configured_server_stays_within_its_default_budget(self):
        tmp = tempfile.mkdtemp(prefix="chunkfuse-budget-")
        store = os.path.join(tmp, "store")
        os.makedirs(store)
        try:
            wrapper = tmpfs_wrapper(tmp, store)
            if wrapper is None:
                self.skipTest("no tmpfs mount here (needs root or user namespaces)")
            server = h.Server(binary=wrapper, cache_dir=store)  # no store option given
            budget = TMPFS_BYTES // 2  # half the free space of an empty 64 MiB file system
            try:
                # ~46 MB of cache files (SmolLM2: ~23 KB a token), more than the budget and
                # less than the file system: without a budget all of them stay.
                sizes = []
                for i in range(8):
                    status, reply = server.post("/v1/chunks", {"texts": [prose(i, 180)]})
                    self.assertEqual(status, 200, reply)
                    sizes.append(server.metrics()['chunkfuse_store_bytes{tier="disk"}'])
                on_disk = files_bytes("/proc/%d/root%s" % (server.proc.pid, store))  # the server's mounts
                log = server.log_text()
            finally:
                code, _ = server.stop()
            self.assertGreater(sizes[0] * 8, budget, "the test wrote too little to reach the budget")
            self.assertLessEqual(max(sizes), budget, (sizes, log))
            if on_disk is not None:
                self.assertLessEqual(on_disk, budget, sizes)
            self.assertIn("disk tier budget 32.0 MiB", log)
            self.assertEqual(code, 0, log)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    unittest.main()

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


if __name__ == "__main__":
    unittest.main()

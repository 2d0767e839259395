#!/usr/bin/env python3
"""Two `chunkfuse serve` replicas behind HAProxy, with and without the shared Redis tier
(issue 13), on bench/serve_load.py's Zipf-skewed HotpotQA workload, against one server alone.

Setups, each from empty stores (fresh temp dirs, a fresh redis-server), same seed:
  single    one server, clients talk to it directly
  private   two replicas, each its own memory+disk store, behind HAProxy
  shared    two replicas + one redis-server (--remote), behind HAProxy
HAProxy hashes a request key consistently (`balance hdr(X-Chunkfuse-Route)`, `hash-type
consistent`; the key is the id of the request's first retrieved passage, see README
"Several replicas"), as a RAG gateway would set it. Documents are sent inline (text), so a
chunk's cache is computed on first use by whichever replica sees it: the chunk-cache work is
the replicas' chunkfuse_store_computes_total, summed.

Reported per setup: errors, throughput, client TTFT p50/p90/p99 (after --warmup), chunk-cache
computations (total and per request), remote hits and bytes read/written; and the ratio of
each setup's computations to single's (target for shared: <= 1.1).

  .venv-serve/bin/python bench/serve_replicas.py --requests 80 --clients 4 --pool 40 --out bench/out/replicas.json
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "serve_e2e"))
import redis_helpers as rh  # noqa: E402
import serve_helpers as h  # noqa: E402
from serve_load import SYSTEM, load_pool, make_workload, percentile  # noqa: E402

HAPROXY_CFG = """global
  maxconn 512
defaults
  mode http
  timeout connect 5s
  timeout client 600s
  timeout server 600s
frontend chunkfuse
  bind 127.0.0.1:{port}
  default_backend replicas
backend replicas
  balance hdr(X-Chunkfuse-Route)
  hash-type consistent
{servers}
"""


class HAProxy:
    def __init__(self, backends):
        self.port = rh.free_port()
        self.tmp = tempfile.mkdtemp(prefix="chunkfuse-haproxy-")
        cfg = os.path.join(self.tmp, "haproxy.cfg")
        servers = "\n".join("  server r%d %s" % (i, url.replace("http://", "")) for i, url in enumerate(backends))
        with open(cfg, "w") as f:
            f.write(HAPROXY_CFG.format(port=self.port, servers=servers))
        self.proc = subprocess.Popen(["haproxy", "-f", cfg, "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + 10
        import socket
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("haproxy exited: %s" % self.proc.stderr.read().decode())
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("haproxy did not listen")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)


def route_key(passage):
    """The request key the gateway sets: here a stable hash of the first retrieved passage."""
    import hashlib
    return hashlib.sha1(passage.encode()).hexdigest()[:16]


def run_setup(setup, args, passages, workload):
    import openai

    redis = rh.Redis() if setup == "shared" else None
    extra = ["--http-threads", str(max(32, 2 * args.clients)), "--max-queue", str(max(64, 4 * args.clients)),
             "--mem-budget", args.mem_budget]
    if redis:
        extra += list(redis.replica_args())
    n = 1 if setup == "single" else 2
    servers = [h.Server(*extra, binary=args.bin, model=args.model, n_threads=args.threads) for _ in range(n)]
    proxy = HAProxy([s.url for s in servers]) if n > 1 else None
    url = proxy.url if proxy else servers[0].url
    results = [None] * len(workload)
    lock = threading.Lock()
    next_index = iter(range(len(workload)))
    fusion = {"method": args.method, "ratio": args.ratio}

    def client_loop():
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            docs, question = workload[i]
            texts = [passages[d] for d in docs]
            start = time.monotonic()
            rec = {"ok": False}
            try:
                stream = client.chat.completions.create(
                    model="chunkfuse", max_tokens=args.max_tokens, temperature=0, stream=True,
                    stream_options={"include_usage": True},
                    messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question: " + question}],
                    extra_body={"documents": texts, "fusion": fusion},
                    extra_headers={"X-Chunkfuse-Route": route_key(texts[0])})
                first = None
                for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.monotonic()
                    if chunk.usage is not None:
                        rec["usage"] = True
                end = time.monotonic()
                rec.update(ok="usage" in rec, ttft_s=(first or end) - start)
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                rec["error"] = "%s: %s" % (type(e).__name__, e)
            with lock:
                results[i] = rec

    try:
        t0 = time.monotonic()
        threads = [threading.Thread(target=client_loop) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        metrics = [s.metrics() for s in servers]
    finally:
        if proxy:
            proxy.stop()
        for s in servers:
            s.stop()
        if redis:
            redis.close()
    ok = [r for r in results if r and r["ok"]]
    ttft = [1000 * r["ttft_s"] for r in results[args.warmup:] if r and r["ok"]]
    total = lambda name: sum(m.get(name, 0.0) for m in metrics)  # noqa: E731
    computes = total("chunkfuse_store_computes_total")
    return {
        "setup": setup, "replicas": n, "ok": len(ok), "errors": len(results) - len(ok),
        "error_examples": [r.get("error") for r in results if r and not r["ok"]][:3],
        "wall_s": wall, "throughput_req_s": len(ok) / wall,
        "ttft_ms": {"p50": percentile(ttft, 50), "p90": percentile(ttft, 90), "p99": percentile(ttft, 99),
                    "mean": statistics.fmean(ttft) if ttft else float("nan")},
        "computes": computes, "computes_per_req": computes / len(workload),
        "computes_per_replica": [m.get("chunkfuse_store_computes_total", 0.0) for m in metrics],
        "remote_hits": total("chunkfuse_remote_hits_total"), "remote_misses": total("chunkfuse_remote_misses_total"),
        "remote_read_bytes": total("chunkfuse_remote_read_bytes_total"),
        "remote_written_bytes": total("chunkfuse_remote_written_bytes_total"),
        "remote_errors": total("chunkfuse_remote_errors_total"),
        "remote_read_ms_mean": 1000 * total("chunkfuse_remote_read_seconds_sum") /
        max(1.0, total("chunkfuse_remote_read_seconds_count")),
        "compute_ms_mean": 1000 * total("chunkfuse_store_compute_seconds_total") / max(1.0, computes),
        "memory_hits": total('chunkfuse_store_hits_total{tier="memory"}'),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=h.binary_path())
    ap.add_argument("--model", default=h.model_path())
    ap.add_argument("--threads", type=int, default=1, help="compute threads per server")
    ap.add_argument("--passages", default="/work/shared/datasets/hotpotqa_dev200.jsonl")
    ap.add_argument("--pool", type=int, default=40)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--mem-budget", default="1GiB")
    ap.add_argument("--method", default="epic")
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--setups", default="single,private,shared")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = min(args.clients, args.requests // 2)
    passages, questions = load_pool(args.passages, args.pool)
    workload = make_workload(args.requests, len(passages), args.docs, args.zipf, questions, args.seed)
    distinct = len({d for docs, _ in workload for d in docs})
    print("workload: %d requests x %d docs over %d passages (Zipf s=%.2f, %d distinct used), %d clients, "
          "max_tokens %d, %d threads per server" % (args.requests, args.docs, len(passages), args.zipf, distinct,
                                                    args.clients, args.max_tokens, args.threads), file=sys.stderr)
    rows = []
    for setup in [s.strip() for s in args.setups.split(",") if s.strip()]:
        print("setup %s ..." % setup, file=sys.stderr)
        rows.append(run_setup(setup, args, passages, workload))
    single = next((r for r in rows if r["setup"] == "single"), None)
    cols = ["setup", "ok/err", "req/s", "TTFT p50", "p90", "p99", "computes (per replica)", "computes/req",
            "vs single", "remote hits", "remote MB read/written", "remote read ms (mean)", "compute ms (mean)"]
    print(" | ".join(cols))
    print(" | ".join("---" for _ in cols))
    for r in rows:
        print(" | ".join([
            r["setup"], "%d/%d" % (r["ok"], r["errors"]), "%.2f" % r["throughput_req_s"],
            "%.0f" % r["ttft_ms"]["p50"], "%.0f" % r["ttft_ms"]["p90"], "%.0f" % r["ttft_ms"]["p99"],
            "%d (%s)" % (r["computes"], "+".join("%d" % c for c in r["computes_per_replica"])),
            "%.2f" % r["computes_per_req"],
            "%.2fx" % (r["computes"] / single["computes"]) if single and single["computes"] else "-",
            "%d" % r["remote_hits"],
            "%.1f/%.1f" % (r["remote_read_bytes"] / 1e6, r["remote_written_bytes"] / 1e6),
            "%.1f" % r["remote_read_ms_mean"] if r["remote_hits"] else "-", "%.0f" % r["compute_ms_mean"]]))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": rows}, f, indent=1)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

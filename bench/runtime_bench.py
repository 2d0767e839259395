#!/usr/bin/env python3
"""Prefill and decode speed of chunkfuse against llama.cpp on the same GGUF and threads.

Both sides run as fresh processes, alternated rep by rep (and with the order swapped
every other rep so that drift such as thermal throttling or a noisy neighbour hits both
alike). Each side is timed on the same token ids:

  prefill N   N ids into an empty KV cache, one timed call (logits of the last row only)
  decode G    after a 512-id prefill, G single-token forward passes, greedy argmax after
              each; the G passes are timed together

Ours is `chunkfuse perf --json`; llama.cpp is llama-cpp-python in a child process of this
script. Model load is outside every timed region on both sides; neither side warms up.
Peak RSS is read with wait4() for both children (same method), and also as reported by
chunkfuse itself; the llama.cpp child's figure includes the Python interpreter, so its
RSS before the model load is reported alongside.

Two llama.cpp peers (--peers, default both), each its own child process per rep:
  repack   ggml's extra buffer types on (llama.cpp's default): CPU weight repacking
           (Q4_0, Q4_K, IQ4_NL into interleaved layouts for its GEMM/GEMV kernels), and
           AMX where the build has it. Build llama.cpp without AMX where its AMX
           kernels crash, as on our Xeon hosts (bench/README.md, "The peer").
  plain    extra buffer types off (use_extra_bufts=false): no repacking, no AMX.
The buffer types each peer actually used are read from llama.cpp's load log and stored.

Run with a Python that has llama-cpp-python (scripts/setup.sh --bench makes .venv/):
  .venv/bin/python bench/runtime_bench.py            # 5 reps, prefill 512 and 2048
  .venv/bin/python bench/runtime_bench.py --quick    # 1 rep, prefill 512 only
  .venv/bin/python bench/runtime_bench.py --model FILE.gguf   # any GGUF both engines load
  .venv/bin/python bench/runtime_bench.py --make-variants     # make the files of issue 11
  python3 bench/runtime_bench.py --ratio-table bench/results/runtime_issue28/*_t2_quiet2.json
                                              # ours / the better peer per rep, from stored files
Prints a Markdown table and writes bench/out/runtime_<time>.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from benchlib import disable_llama_extra_buffers  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PEERS = {"repack": True, "plain": False}  # peer name -> use_extra_bufts
DECODE_CONTEXT = 512  # ids prefilled before the decode timing (the perf contract)

# llama.cpp context settings. n_batch/n_ubatch are llama.cpp's own defaults (common
# params: 2048/512): a 2048-id prompt is one llama_decode call, split internally into
# 512-row micro-batches. n_ctx 4096 holds the longest prompt plus decode.
LLAMA_N_CTX = 4096
LLAMA_N_BATCH = 2048
LLAMA_N_UBATCH = 512


def cache_models_dir() -> str:
    """Same rule as src/base/paths.cpp."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/tmp"), ".cache")
    return os.path.join(cache, "chunkfuse", "models")


def default_model() -> str:
    if os.environ.get("CHUNKFUSE_MODEL"):
        return os.environ["CHUNKFUSE_MODEL"]
    return os.path.join(cache_models_dir(), DEFAULT_MODEL_FILE)


def make_variants(args: argparse.Namespace) -> None:
    """The files issue 11 benchmarks: the default model requantized by llama.cpp (allow_requantize)
    to Q4_K_M, Q8_0 and Q4_0, and the random-weight shapes at Q4_K_M (tools/make_shape_models.py)."""
    tool = str(REPO / "tools" / "make_shape_models.py")
    variants = os.path.join(cache_models_dir(), "variants")
    shapes = "qwen2.5-0.5b,llama3.2-1b" + (",llama3.1-8b" if args.with_8b else "")
    steps = [[sys.executable, tool, "--requantize", args.model, "--types", "Q4_K_M,Q8_0,Q4_0", "--no-ref",
              "--out", variants],
             [sys.executable, tool, "--shapes", shapes, "--types", "Q4_K_M", "--no-ref"]]
    for cmd in steps:
        print("+ " + " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
    print(f"variants in {variants}, shapes in {os.path.join(cache_models_dir(), 'shapes')}; "
          "run with --model FILE", file=sys.stderr)


def default_dataset() -> str:
    candidates = []
    if os.environ.get("CHUNKFUSE_DATASETS"):
        candidates.append(Path(os.environ["CHUNKFUSE_DATASETS"]) / "musique_s.json")
    candidates += [REPO.parent / "shared" / "datasets" / "musique_s.json",
                   Path("/work/shared/datasets/musique_s.json")]
    for c in candidates:
        if c.is_file():
            return str(c)
    return str(candidates[0])


def vm_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# ----------------------------------------------------------------------------------------
# llama.cpp side: runs in a child process (`--llama-worker`) so that its peak RSS and its
# page-cache/allocator state are its own, exactly like a run of our binary.
# ----------------------------------------------------------------------------------------
def llama_worker(args: argparse.Namespace) -> None:
    import ctypes

    import llama_cpp
    import numpy as np

    if not PEERS[args.peer]:
        disable_llama_extra_buffers()  # tools/benchlib.py says why

    ids = json.loads(Path(args.ids).read_text())
    rss_base = vm_rss_bytes()
    # verbose: the load log names the buffer types (CPU_REPACK, AMX) the driver records.
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=LLAMA_N_CTX, n_threads=args.threads,
                          n_threads_batch=args.threads, n_batch=LLAMA_N_BATCH,
                          n_ubatch=LLAMA_N_UBATCH, verbose=True)
    n_vocab = llm.n_vocab()

    def clear() -> None:
        llm.reset()  # n_tokens = 0; eval() then drops cache rows from 0 on
        llm._ctx.kv_cache_clear()

    def last_logits_argmax() -> int:
        ptr = llm._ctx.get_logits()  # rows with output; without logits_all, the last one
        return int(np.argmax(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                                   shape=(n_vocab,))))

    prefill = []
    for n in args.prompt_tokens:
        clear()
        t0 = time.perf_counter()
        llm.eval(ids[:n])
        s = time.perf_counter() - t0
        prefill.append({"n_tokens": n, "seconds": s, "tok_per_s": n / s})

    clear()
    llm.eval(ids[:DECODE_CONTEXT])
    tok = last_logits_argmax()
    t0 = time.perf_counter()
    for _ in range(args.gen_tokens):
        llm.eval([tok])
        tok = last_logits_argmax()
    s = time.perf_counter() - t0
    decode = {"n_tokens": args.gen_tokens, "seconds": s, "tok_per_s": args.gen_tokens / s}

    import resource
    print(json.dumps({
        "prefill": prefill,
        "decode": decode,
        "rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_before_model_bytes": rss_base,
        "threads": args.threads,
        "peer": args.peer,
        "use_extra_bufts": PEERS[args.peer],
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }))


def model_buffers(load_log: str) -> dict:
    """'load_tensors: CPU_REPACK model buffer size = 12.34 MiB' lines -> {buffer type: MiB}."""
    out: dict = {}
    for name, mib in re.findall(r"(\S+) model buffer size\s*=\s*([0-9.]+) MiB", load_log):
        out[name] = out.get(name, 0.0) + float(mib)
    return out


# ----------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------
def runnable_now() -> int:
    """Processes running or runnable right now, less this one (/proc/loadavg's fourth field)."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0]) - 1


def wait_quiet(limit_s: float) -> dict:
    """Waits (up to limit_s) until nothing else is runnable in two polls in a row: on a shared
    machine other jobs come in bursts (compiles), and llama.cpp's OpenMP threads, which spin at
    their barriers, lose far more than ours to a busy neighbour."""
    t0 = time.monotonic()
    quiet = 0
    while time.monotonic() - t0 < limit_s:
        quiet = quiet + 1 if runnable_now() <= 0 else 0
        if quiet >= 2:
            break
        time.sleep(0.5)
    return {"waited_s": round(time.monotonic() - t0, 1), "runnable_at_start": runnable_now()}


def run_child(cmd: list[str], env: dict | None = None) -> tuple[str, str, int, int]:
    """Runs cmd; returns stdout, stderr, exit code and the child's own peak RSS (wait4)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)  # already reaped: tell Popen
        out.seek(0)
        err.seek(0)
        return (out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                p.returncode, usage.ru_maxrss * 1024)


def parse_json_output(text: str) -> dict:
    """The result is one JSON object; tolerate log lines printed before it."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        start = text.rfind("\n{")
        if start >= 0:
            return json.loads(text[start + 1:])
        raise


def make_token_ids(model: str, dataset: str, n_needed: int, path: Path) -> list[int]:
    """Passages of MuSiQue concatenated until llama.cpp's tokenizer gives n_needed ids."""
    import llama_cpp

    vocab = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    items = json.loads(Path(dataset).read_text())
    passages = [c["text"] for it in items for c in it["ctxs"] if c.get("text")]
    ids: list[int] = []
    used = 0
    chars_per_round = 8 * n_needed  # generous: English runs ~4 chars per token
    while len(ids) < n_needed:
        if used >= len(passages):
            raise SystemExit(f"{dataset}: only {len(ids)} tokens, need {n_needed}")
        n_chars = 0
        while used < len(passages) and n_chars < chars_per_round:
            n_chars += len(passages[used])
            used += 1
        # Tokenized as one text with the model's own BOS rule (add_bos honours the GGUF).
        ids = vocab.tokenize("\n\n".join(passages[:used]).encode(), add_bos=True)
    ids = ids[:n_needed]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ids))
    return ids


def cpu_info() -> dict:
    info = {"cpu_count": os.cpu_count(), "platform": platform.platform()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, val = line.partition(":")
            if key.strip() in ("Model name", "Socket(s)", "Core(s) per socket", "Thread(s) per core",
                               "L3 cache"):
                info[key.strip()] = val.strip()
            if key.strip() == "Flags":
                flags = val.split()
                info["isa_flags"] = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw",
                                                 "avx512vnni", "avx512_vnni", "avx512vl")
                                     if f in flags]
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def fmt_spread(s: dict | None, digits: int = 1) -> str:
    if s is None:
        return "n/a"
    if len(s["values"]) == 1:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def best_peer_ratios(reps: list[dict], peers: list[str], key, higher_is_better: bool) -> list[float]:
    """Per rep, ours / the better llama.cpp peer of that rep (the faster for speeds, the leaner
    for memory): the issue-28 ratio, paired within each rep."""
    out = []
    for r in reps:
        theirs = [key(r[f"llama_{p}"]) for p in peers if r.get(f"llama_{p}")]
        if r.get("ours") and theirs:
            out.append(key(r["ours"]) / (max(theirs) if higher_is_better else min(theirs)))
    return out


def summarize(reps: list[dict], args: argparse.Namespace) -> list[dict]:
    """One row per metric: spread of ours, of each llama.cpp peer, of the paired per-rep ratio
    ours / peer, and of ours / the better peer of each rep ("best")."""
    def metric(side: str, key) -> list[float] | None:
        vals = [key(r[side]) for r in reps if r.get(side)]
        return vals or None

    rows = []
    specs = [(f"prefill {n} (tok/s)", (lambda n: lambda r: next(
        p["tok_per_s"] for p in r["prefill"] if p["n_tokens"] == n))(n), 1) for n in args.prompt_tokens]
    specs.append((f"decode {args.gen_tokens} after {DECODE_CONTEXT} (tok/s)",
                  lambda r: r["decode"]["tok_per_s"], 1))
    specs.append(("peak RSS, wait4 (MiB)", lambda r: r["rss_wait4_bytes"] / 2**20, 1))
    # The llama.cpp child carries a Python interpreter with numpy; subtract what it held
    # before loading the model to compare the engines themselves.
    specs.append(("peak RSS less interpreter (MiB)",
                  lambda r: (r["rss_wait4_bytes"] - r.get("rss_before_model_bytes", 0)) / 2**20, 1))
    for name, key, digits in specs:
        row = {"metric": name, "ours": None, "digits": digits, "peers": {}}
        ours = metric("ours", key)
        row["ours"] = spread(ours) if ours else None
        for peer in args.peers:
            side = f"llama_{peer}"
            theirs = metric(side, key)
            ratios = None
            if ours and theirs:
                ratios = [key(r["ours"]) / key(r[side]) for r in reps if r.get("ours") and r.get(side)]
            row["peers"][peer] = {"llama": spread(theirs) if theirs else None,
                                  "ratio": spread(ratios) if ratios else None}
        best = best_peer_ratios(reps, args.peers, key, higher_is_better="tok/s" in name)
        row["best"] = spread(best) if best else None
        rows.append(row)
    return rows


def summarize_file(path: str) -> tuple[dict, list[dict]]:
    """The rows of a stored result JSON, summarized anew from its reps (files written before
    the "best" column get it too)."""
    with open(path) as f:
        j = json.load(f)
    meta, reps = j["meta"], j["reps"]
    ours = next(r["ours"] for r in reps if r.get("ours"))
    args = argparse.Namespace(prompt_tokens=[p["n_tokens"] for p in ours["prefill"]],
                              gen_tokens=ours["decode"]["n_tokens"], peers=meta["peers"])
    return meta, summarize(reps, args)


def ratio_table(paths: list[str]) -> str:
    """One Markdown line per result file: ours in tok/s, then ours / the better peer per speed
    metric, median [min-max] over the reps (docs/benchmarks-history.md's issue-28 tables)."""
    lines = []
    for path in paths:
        meta, rows = summarize_file(path)
        speed = [r for r in rows if "tok/s" in r["metric"]]
        ours = " / ".join(f"{r['ours']['median']:.0f}" for r in speed)
        cells = " | ".join(fmt_spread(r["best"], 2) for r in speed)
        lines.append(f"| {Path(path).name} | {ours} | {cells} | load {meta['loadavg_1_5_15_before'][0]:.1f}/"
                     f"{meta['loadavg_1_5_15_after'][0]:.1f} |")
    return "\n".join(lines)


def markdown(rows: list[dict], meta: dict) -> str:
    peers = meta["peers"]
    head = "| metric | chunkfuse |" + "".join(f" llama.cpp {p} | ours / {p} |" for p in peers) + " ours / better peer |"
    lines = [
        f"chunkfuse vs llama.cpp on {Path(meta['model']).name} — {meta['machine'].get('Model name', '?')}, "
        f"{meta['threads']} threads, {meta['reps']} reps, median [min–max]; ours: {meta.get('ours_isa') or '?'} kernels; "
        f"peer: {meta['llama_cpp'].get('system_info_short', '?')}; "
        f"load average before/after {meta['loadavg_1_5_15_before'][0]:.1f}/{meta['loadavg_1_5_15_after'][0]:.1f}; "
        "peers: " + ", ".join(f"{p} (buffers {meta['llama_cpp']['buffers'].get(p, '?')})" for p in peers),
        "",
        head,
        "|---|---:|" + "---:|---:|" * len(peers) + "---:|",
    ]
    for r in rows:
        cells = "".join(f" {fmt_spread(r['peers'][p]['llama'], r['digits'])} | {fmt_spread(r['peers'][p]['ratio'], 2)} |"
                        for p in peers)
        lines.append(f"| {r['metric']} | {fmt_spread(r['ours'], r['digits'])} |{cells} {fmt_spread(r.get('best'), 2)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--binary", default=str(REPO / "build" / "chunkfuse"))
    ap.add_argument("--dataset", default=default_dataset(), help="musique_s.json (token source)")
    ap.add_argument("--ids", help="JSON list of token ids to use instead of tokenizing the dataset")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt-tokens", default="512,2048")
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="1 rep, prefill 512 only")
    ap.add_argument("--only", choices=("both", "ours", "llama"), default="both",
                    help="run one side only (for debugging; no ratios)")
    ap.add_argument("--peers", default="repack,plain",
                    help="llama.cpp peers to run: repack (extra buffer types on), plain (off); comma-separated")
    ap.add_argument("--make-variants", action="store_true",
                    help="make the issue-11 files (requantized --model, random-weight shapes) and exit")
    ap.add_argument("--with-8b", action="store_true", help="--make-variants also makes the Llama-3.1-8B shape")
    ap.add_argument("--out", help="JSON result path (default bench/out/runtime_<time>.json)")
    ap.add_argument("--llama-extra-bufts", action="store_true", help="same as --peers repack (older name)")
    ap.add_argument("--peer-python", default=sys.executable,
                    help="Python whose llama-cpp-python is the peer (default: this one), e.g. .venv-avx2/bin/python "
                         "for a peer built for AVX2 only (bench/README.md, \"An AVX2 peer\")")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="before each side's run, wait up to SECONDS until no other process is runnable "
                         "(a shared machine; recorded per run)")
    ap.add_argument("--isa", choices=("amx", "avx512", "avx2", "portable"),
                    help="CHUNKFUSE_ISA for our side only (caps our kernels; the peer's ISA is its build's)")
    ap.add_argument("--ratio-table", nargs="+", metavar="RESULT.json",
                    help="run nothing: print ours / the better peer of each rep for stored result files, "
                         "one Markdown line each (prefill and decode, median [min-max])")
    ap.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peer", choices=tuple(PEERS), default="repack", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.reps, args.prompt_tokens = 1, "512"
    args.prompt_tokens = [int(x) for x in str(args.prompt_tokens).split(",") if x]
    args.peers = ["repack"] if args.llama_extra_bufts else [p for p in args.peers.split(",") if p]
    for p in args.peers:
        if p not in PEERS:
            raise SystemExit(f"unknown peer {p} (choose from {', '.join(PEERS)})")

    if args.ratio_table:
        print(ratio_table(args.ratio_table))
        return
    if args.llama_worker:
        llama_worker(args)
        return
    if args.make_variants:
        make_variants(args)
        return

    if not Path(args.model).is_file():
        raise SystemExit(f"model not found: {args.model} (run scripts/setup.sh)")
    if args.only != "llama" and not Path(args.binary).is_file():
        raise SystemExit(f"binary not found: {args.binary} (build it: scripts/run.sh or cmake)")

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_path = Path(args.out) if args.out else REPO / "bench" / "out" / f"runtime_{stamp}.json"
    n_needed = max(args.prompt_tokens + [DECODE_CONTEXT])
    if args.ids:
        ids_path = Path(args.ids)
        ids = json.loads(ids_path.read_text())
        if len(ids) < n_needed:
            raise SystemExit(f"{ids_path}: {len(ids)} ids, need {n_needed}")
    else:
        ids_path = out_path.with_name(f"ids_{stamp}.json")
        ids = make_token_ids(args.model, args.dataset, n_needed, ids_path)
    print(f"token ids: {len(ids)} in {ids_path}", file=sys.stderr)

    prompt_csv = ",".join(map(str, args.prompt_tokens))
    ours_cmd = [args.binary, "perf", "-m", args.model, "--tokens-file", str(ids_path),
                "--prompt-tokens", prompt_csv, "--gen-tokens", str(args.gen_tokens),
                "--threads", str(args.threads), "--json"]
    sides = {"ours": ours_cmd}
    for peer in args.peers:
        sides[f"llama_{peer}"] = [args.peer_python, str(Path(__file__).resolve()), "--llama-worker", "--peer", peer,
                                  "--model", args.model, "--ids", str(ids_path), "--prompt-tokens", prompt_csv,
                                  "--gen-tokens", str(args.gen_tokens), "--threads", str(args.threads)]
    llama_sides = [f"llama_{p}" for p in args.peers]
    wanted = {"both": ["ours"] + llama_sides, "ours": ["ours"], "llama": llama_sides}[args.only]

    ours_env = None
    if args.isa:
        ours_env = dict(os.environ, CHUNKFUSE_ISA=args.isa)
    load_before = os.getloadavg()
    reps = []
    for rep in range(args.reps):
        order = wanted[rep % len(wanted):] + wanted[:rep % len(wanted)]  # each side takes each slot in turn
        if rep % 2:
            order.reverse()
        result = {"rep": rep, "order": order}
        for side in order:
            quiet = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
            stdout, stderr, rc, rss = run_child(sides[side], ours_env if side == "ours" else None)
            if rc != 0:
                sys.stderr.write(stderr[-4000:])
                raise SystemExit(f"{side} failed (exit {rc}): {' '.join(sides[side])}")
            r = parse_json_output(stdout)
            r["rss_wait4_bytes"] = rss
            if quiet is not None:
                r["quiet"] = quiet
            if side != "ours":
                r["model_buffers_mib"] = model_buffers(stderr)
            result[side] = r
        reps.append(result)
        brief = "  ".join(f"{s}: " + " ".join(f"{p['n_tokens']}→{p['tok_per_s']:.0f}" for p in result[s]["prefill"])
                          + f" dec {result[s]['decode']['tok_per_s']:.1f} tok/s" for s in wanted)
        print(f"rep {rep + 1}/{args.reps}: {brief}", file=sys.stderr)

    meta = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": cpu_info(),
        "threads": args.threads,
        "reps": args.reps,
        # Other processes on the machine skew both sides; the load average says how busy it was.
        "loadavg_1_5_15_before": load_before,
        "loadavg_1_5_15_after": os.getloadavg(),
        "model": args.model,
        "binary": args.binary,
        "ours_cmd": ours_cmd,
        "ours_isa_env": args.isa,
        "peer_python": args.peer_python,
        "peers": args.peers,
        "llama_cpp": {"n_ctx": LLAMA_N_CTX, "n_batch": LLAMA_N_BATCH, "n_ubatch": LLAMA_N_UBATCH,
                      "use_extra_bufts": {p: PEERS[p] for p in args.peers},
                      "buffers": {p: reps[0][f"llama_{p}"].get("model_buffers_mib")
                                  for p in args.peers if reps and reps[0].get(f"llama_{p}")}},
        "decode_context": DECODE_CONTEXT,
        "token_ids": str(ids_path),
    }
    try:
        import llama_cpp
        meta["llama_cpp"]["version"] = llama_cpp.__version__
    except ImportError:
        pass
    for p in args.peers:
        if reps and reps[0].get(f"llama_{p}"):
            meta["llama_cpp"]["system_info"] = reps[0][f"llama_{p}"].get("system_info")
    info = meta["llama_cpp"].get("system_info") or ""
    # The ISA flags the peer's ggml was built with ("AVX2 = 1 | ... | AVX512 = 0"): the set ones.
    meta["llama_cpp"]["system_info_short"] = ",".join(
        f for f in re.findall(r"(AVX\w*|FMA|F16C|AMX\w*) = 1", info) if f) or None
    if reps and reps[0].get("ours"):
        meta["ours_isa"] = reps[0]["ours"].get("isa")
    rows = summarize(reps, args)
    table = markdown(rows, meta)
    print(table)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"meta": meta, "summary": [{k: v for k, v in r.items() if k != "digits"}
                                                              for r in rows],
                                    "reps": reps, "table_md": table}, indent=1))
    print(f"\nwrote {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()

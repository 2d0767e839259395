#!/usr/bin/env python3
"""Writes the float64-reference fixture beside a llama.cpp golden fixture.

For tests/golden/<stem>.json (tools/make_golden.py) it writes tests/golden/<stem>.f64.json:
the exact dequantized model's logits (tools/f64_reference.py) on the same prompts, and how
far llama.cpp's own logits are from them, which is what the engine's tolerance is derived
from (docs/ARCHITECTURE.md, "Numerics contract").

    OMP_NUM_THREADS=1 .venv-serve/bin/python tools/make_f64_golden.py \
        --model ~/.cache/chunkfuse/models/SmolLM2-135M-Instruct.Q4_1.gguf --golden tests/golden/smollm2_q4_1.json
    (likewise qwen2.5-coder-0.5b-instruct-q4_k_m.gguf with qwen2.5_coder_0.5b_instruct_q4_k_m.json,
     gemma-3-270m-q4_k_m.gguf with gemma3_270m_q4_k_m.json)

Fixture format (JSON object, format_version 1):
  generator, date, numpy_version, gguf_version
  model            {file, size, sha256}   must equal the llama.cpp fixture's
  llama_fixture    {file, sha256}         the fixture whose prompts and top ids are used
  logits: [        one per llama.cpp "logits" case, same prompt_ids
    {name, prompt_ids,
     positions: [{ids: the llama.cpp fixture's top-10 ids of this position (its order),
                  at: the f64 logits at those ids, top_ids: f64 top-10 ids (larger logit first,
                  smaller id on ties), top_logits: their f64 logits}]}]
  greedy: [        one per llama.cpp "greedy" case
    {name, prompt_ids, n_predict, output_ids (f64 greedy: argmax, smallest id on ties),
     margins (f64 top-1 minus top-2 logit per step), steps: [{top_ids, top_logits}] (f64's
     top-10 at each step, the row that chose output_ids[step]: prompt_ids + output_ids[:step]
     evaluated), llama_equal (llama.cpp's output_ids == output_ids), first_difference (step, or -1)}]
  nll              {source, ids, n_predicted, mean_nll}  f64 mean negative log-likelihood
                   (nats) of ids[1:]; ids are the first --nll-tokens ids of the llama.cpp
                   fixture's "musique_passage" tokenize case, after BOS for a file that adds one
  summary          llama.cpp against f64: per position, the max |diff| over the 10 ids
                   llama.cpp lists; {positions, max, median, p90, mean, top1_equal,
                   top1_agreement, by_prompt: {name: {positions, max, median, top1_equal}},
                   greedy_equal, greedy_total}
  Logits are rounded to 5 decimals.
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import sha256_of  # noqa: E402
from f64_reference import F64Model, _field  # noqa: E402


def r5(x):
    return round(float(x), 5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--golden", required=True, help="the llama.cpp fixture (tools/make_golden.py)")
    ap.add_argument("--out", help="default: the golden fixture's path with .f64.json")
    ap.add_argument("--nll-tokens", type=int, default=512)
    ap.add_argument("--store", default="f64", choices=("f64", "f32", "none"),
                    help="how the dequantized weights are kept (f32: half the memory, same results)")
    ap.add_argument("--skip", default="", help="comma-separated logits/greedy case names to leave out (slow ones)")
    args = ap.parse_args()
    out_path = args.out or args.golden[: -len(".json")] + ".f64.json"
    skip = set(filter(None, args.skip.split(",")))

    with open(args.golden, encoding="utf-8") as f:
        golden = json.load(f)
    model_info = {"file": os.path.basename(args.model), "size": os.path.getsize(args.model),
                  "sha256": sha256_of(args.model)}
    if model_info["sha256"] != golden["model"]["sha256"]:
        sys.exit(f"{args.model} is not the file {args.golden} was made from")

    import gguf
    from importlib.metadata import version
    t0 = time.time()
    m = F64Model(args.model, store=args.store)
    print(f"loaded {model_info['file']} ({m.arch}) in {time.time() - t0:.1f}s", file=sys.stderr)

    out = {"format_version": 1, "generator": "tools/make_f64_golden.py (tools/f64_reference.py)",
           "date": datetime.date.today().isoformat(), "numpy_version": np.__version__,
           "gguf_version": version("gguf"), "model": model_info,
           "llama_fixture": {"file": os.path.basename(args.golden), "sha256": sha256_of(args.golden)}}

    # --- logits
    per_pos, top1_same, by_prompt, cases = [], 0, {}, []
    for c in golden["logits"]:
        if c["name"] in skip:
            continue
        t = time.time()
        ids = c["prompt_ids"]
        lg = m.prefill(ids)
        positions, diffs, same = [], [], 0
        for p, ref in enumerate(c["positions"]):
            row = lg[p]
            order = np.argsort(-row, kind="stable")[:10]
            at = [r5(row[i]) for i in ref["ids"]]
            positions.append({"ids": ref["ids"], "at": at, "top_ids": [int(i) for i in order], "top_logits": [r5(row[i]) for i in order]})
            diffs.append(float(np.max(np.abs(np.array(ref["logits"]) - row[ref["ids"]]))))
            same += int(order[0] == ref["ids"][0])
        cases.append({"name": c["name"], "prompt_ids": ids, "positions": positions})
        per_pos += diffs
        top1_same += same
        by_prompt[c["name"]] = {"positions": len(diffs), "max": r5(max(diffs)), "median": r5(np.median(diffs)),
                                "top1_equal": same}
        print(f"  logits {c['name']}: {len(ids)} positions, llama.cpp vs f64 max {max(diffs):.3f} "
              f"median {np.median(diffs):.3f}, top-1 equal {same}  ({time.time() - t:.1f}s)", file=sys.stderr)
    out["logits"] = cases

    # --- greedy
    greedy, g_equal = [], 0
    for c in golden["greedy"]:
        if c["name"] in skip:
            continue
        t = time.time()
        ids, want, tops = m.greedy(c["prompt_ids"], c["n_predict"])
        llama = c["output_ids"]
        first = next((i for i, (a, b) in enumerate(zip(ids, llama)) if a != b), -1)
        greedy.append({"name": c["name"], "prompt_ids": c["prompt_ids"], "n_predict": c["n_predict"],
                       "output_ids": ids, "margins": [r5(x) for x in want],
                       "steps": [{"top_ids": t[0], "top_logits": [r5(x) for x in t[1]]} for t in tops],
                       "llama_equal": ids == llama,
                       "first_difference": first})
        g_equal += int(ids == llama)
        note = "" if first < 0 else (f", parts at step {first} (f64 margin {want[first]:.3f}, "
                                     f"llama.cpp margin {c['margins'][first]:.3f})")
        print(f"  greedy {c['name']}: equal to llama.cpp {ids == llama}{note}  ({time.time() - t:.1f}s)",
              file=sys.stderr)
    out["greedy"] = greedy

    # --- NLL over a fixed passage
    passage = next(c for c in golden["tokenize"] if c["name"] == "musique_passage")
    nll_ids = list(passage["ids"][: args.nll_tokens])
    source = f"the first {len(nll_ids)} ids of the llama.cpp fixture's musique_passage tokenize case"
    if bool(_field(m.reader, "tokenizer.ggml.add_bos_token", False)):
        bos = int(_field(m.reader, "tokenizer.ggml.bos_token_id"))
        nll_ids = [bos] + nll_ids
        source = "BOS, then " + source
    t = time.time()
    nll, count = m.mean_nll(nll_ids)
    out["nll"] = {"source": source, "ids": nll_ids, "n_predicted": count, "mean_nll": round(nll, 6)}
    print(f"  nll over {count} predictions: {nll:.5f}  ({time.time() - t:.1f}s)", file=sys.stderr)

    d = np.array(per_pos)
    out["summary"] = {"positions": len(per_pos), "max": r5(d.max()), "median": r5(np.median(d)),
                      "p90": r5(np.percentile(d, 90)), "mean": r5(d.mean()), "top1_equal": top1_same,
                      "top1_agreement": r5(top1_same / len(per_pos)), "by_prompt": by_prompt,
                      "greedy_equal": g_equal, "greedy_total": len(greedy)}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        f.write("\n")
    s = out["summary"]
    print(f"wrote {out_path}: llama.cpp vs f64 over {s['positions']} positions: max {s['max']:.3f}, median "
          f"{s['median']:.3f}, top-1 {s['top1_equal']}/{s['positions']}; greedy {g_equal}/{len(greedy)} "
          f"equal; f64 NLL {nll:.5f}  (total {time.time() - t0:.0f}s)", file=sys.stderr)


if __name__ == "__main__":
    main()

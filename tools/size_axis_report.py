#!/usr/bin/env python3
"""Model size as an axis (issue 23, item 6): fidelity to full prefill and first-token KL per
selector at one recompute ratio, against the model's parameter count, from `chunkfuse bench`
result folders of the same prompts on several models.

    .venv/bin/python tools/size_axis_report.py --ratio 0.15 --out bench/results/issue23_size_axis \\
        smollm2_135m=135e6 gemma3_270m=268e6 qwen25_05b=494e6 qwen25_15b=1.54e9

Each NAME=PARAMS names a folder under --out holding results.jsonl; NAME=PARAMS=FOLDER reads
FOLDER instead (a bench folder elsewhere, e.g. a model's full matrix). Writes size_axis.md (a
table with 95% bootstrap intervals over examples, bench_report.py's resampling) and
size_axis.png (two panels, one line per selector).

Only rows of one chunk context (--chunk-context, default alone) and of the first --limit
examples count, and only the examples every selector of every model ran: the same prompts on
every model, so a row's difference between models is the model's, not the draw's.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_report import bootstrap_mean_ci, chunk_context, mean, read_rows  # noqa: E402


def rows_by_method(rows, ratio, context="alone", limit=0):
    """{method: {example: row}} of the rows at `ratio` (reuse at any ratio: it recomputes
    nothing), of one chunk context (read by bench_report.chunk_context, which knows the older
    field name), and of the first `limit` examples (0: all)."""
    by_method = {}
    for r in rows:
        if r["method"] == "full":
            continue
        if r["method"] != "reuse" and abs(r["ratio"] - ratio) > 1e-9:
            continue
        if chunk_context(r) != context:
            continue
        if limit and r["example_index"] >= limit:
            continue
        by_method.setdefault(r["method"], {})[r["example"]] = r
    return by_method


def common_examples(by_methods):
    """The examples every method of every model (a list of rows_by_method results) ran."""
    sets = [set(per) for by_method in by_methods for per in by_method.values()]
    return set.intersection(*sets) if sets else set()


def model_table(by_method, common):
    """{method: {"fidelity": [...], "kl": [...], "first": [...], "n": int}} over `common`."""
    examples = sorted(common)
    out = {}
    for m, per in by_method.items():
        rs = [per[e] for e in examples]
        out[m] = {"fidelity": [x["fidelity_f1"] for x in rs], "kl": [x["kl"] for x in rs],
                  "first": [1.0 if x["first_token_agree"] else 0.0 for x in rs], "n": len(rs)}
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--out", required=True)
    ap.add_argument("--chunk-context", default="alone", help="rows of this chunk context only (alone, prefixed)")
    ap.add_argument("--limit", type=int, default=0, help="the first N examples only (0: all)")
    ap.add_argument("models", nargs="+",
                    help="NAME=PARAMS[=FOLDER] (folder: under --out by default; parameter count)")
    a = ap.parse_args(argv)
    loaded = []
    for spec in a.models:
        name, params, folder = (spec.split("=", 2) + ["", ""])[:3]
        path = os.path.join(folder or os.path.join(a.out, name), "results.jsonl")
        if not params or not os.path.isfile(path):
            sys.exit("size_axis_report: want NAME=PARAMS[=FOLDER] with %s present" % path)
        loaded.append((name, float(params), rows_by_method(read_rows(path), a.ratio, a.chunk_context, a.limit)))
    common = common_examples([by_method for _, _, by_method in loaded])
    if not common:
        sys.exit("size_axis_report: no example that every selector of every model ran")
    models = [(name, params, model_table(by_method, common)) for name, params, by_method in loaded]
    methods = sorted({m for _, _, t in models for m in t})

    lines = ["| model | params | examples | method | fidelity F1 [95% CI] | first token equal | KL [95% CI] |",
             "|---|---:|---:|---|---|---:|---|"]
    for name, params, table in models:
        for m in methods:
            if m not in table:
                continue
            t = table[m]
            (flo, fhi), (klo, khi) = bootstrap_mean_ci([t["fidelity"], t["kl"]])
            lines.append("| %s | %.0fM | %d | %s | %.3f [%.3f, %.3f] | %.2f | %.3f [%.3f, %.3f] |" % (
                name, params / 1e6, t["n"], m, mean(t["fidelity"]), flo, fhi, mean(t["first"]),
                mean(t["kl"]), klo, khi))
    md = os.path.join(a.out, "size_axis.md")
    with open(md, "w") as f:
        f.write("Fidelity to full prefill and first-token KL at ratio %g (reuse: 0) by model size, chunk caches "
                "%s, the same %d examples on every model.\n\n" % (a.ratio, a.chunk_context, len(common)))
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for m in methods:
        xs = [p for _, p, t in models if m in t]
        fid = [mean(t[m]["fidelity"]) for _, _, t in models if m in t]
        kl = [mean(t[m]["kl"]) for _, _, t in models if m in t]
        axes[0].plot(xs, fid, marker="o", label=m)
        axes[1].plot(xs, kl, marker="o", label=m)
    for ax, title in zip(axes, ["fidelity F1 to full prefill", "first-token KL (full || fused)"]):
        ax.set_xscale("log")
        ax.minorticks_off()  # only the models' own sizes are labelled
        ax.set_xlabel("parameters")
        ax.set_title("%s, ratio %g" % (title, a.ratio))
        ax.grid(True, alpha=0.3)
        ax.set_xticks([p for _, p, _ in models])
        ax.set_xticklabels(["%s\n%.0fM" % (n, p / 1e6) for n, p, _ in models], fontsize=7)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    png = os.path.join(a.out, "size_axis.png")
    fig.savefig(png, dpi=110)
    print("wrote", md, "and", png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Summarises `chunkfuse deviation` output (issue 14, item 3).

Usage: deviation_report.py OUT_DIR

Reads OUT_DIR/deviation.csv (one row per example, chunk context, method, ratio, part,
layer: relative L2 distance of K and V from full prefill) and writes
  OUT_DIR/deviation_summary.csv  mean over examples per (chunk context, method, ratio, part, layer)
  OUT_DIR/deviation.md           K and V distances at chosen layers, and the change against
                                 reuse on alone caches ("70% lower at layer 2" is one line)
  OUT_DIR/deviation_<part>_<k|v>.png  distance per layer, one line per method/ratio/chunk context
                                 (needs matplotlib; skipped with a note without it)
"""
import csv
import os
import sys
from collections import defaultdict


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def label(context, method, ratio):
    r = float(ratio)
    name = "enriched (fusionrag@0)" if method == "fusionrag" and r == 0 else f"{method}@{r:g}"
    return f"{name} [{context}]"


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    rows = read(os.path.join(out, "deviation.csv"))
    if not rows:
        print("deviation.csv is empty", file=sys.stderr)
        return 1
    acc = defaultdict(lambda: [0.0, 0.0, 0])  # key -> k sum, v sum, n
    examples = set()
    for r in rows:
        # "chunk_context"; deviation.csv files written before issue 25 name it "chunk_variant".
        key = (r.get("chunk_context", r.get("chunk_variant")), r["method"], float(r["ratio"]), r["part"], int(r["layer"]))
        a = acc[key]
        a[0] += float(r["k_rel"])
        a[1] += float(r["v_rel"])
        a[2] += 1
        examples.add(r["example"])
    mean = {k: (a[0] / a[2], a[1] / a[2], a[2]) for k, a in acc.items()}
    with open(os.path.join(out, "deviation_summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["chunk_context", "method", "ratio", "part", "layer", "k_rel_mean", "v_rel_mean", "n"])
        for k in sorted(mean):
            w.writerow(list(k) + [f"{mean[k][0]:.6g}", f"{mean[k][1]:.6g}", mean[k][2]])

    layers = sorted({k[4] for k in mean})
    last = layers[-1]
    shown = [l for l in (0, 1, 2, 3, 4, 6, 8, 12, 16, 20, 24) if l < last] + [last]
    runs = []
    for k in mean:
        if k[:4] not in runs:
            runs.append(k[:4])
    runs.sort(key=lambda r: (r[3], r[0], r[1] != "reuse", r[1], r[2]))

    def same_as_reuse(run):
        ref = (run[0], "reuse", 0.0, run[3])
        return run[1] != "reuse" and all(mean.get(run + (l,), (None,))[:2] == mean.get(ref + (l,), (None,))[:2]
                                         for l in layers)
    # A selector at ratio 0 serves the base caches unchanged: identical to reuse, one line is enough.
    runs = [r for r in runs if not same_as_reuse(r)]
    lines = [f"# Layer-wise K/V deviation from full prefill ({len(examples)} examples)", "",
             "Relative L2 distance ||X - X_full|| / ||X_full|| over the slots of the part, mean over examples. "
             "Layers are 0-based (the papers' \"layer 2\" is layer 1 here). \"vs reuse\" is the change against "
             "reuse on the same chunk context at that layer (negative: lower deviation).", ""]
    for part in ("context", "question"):
        for xi, x in ((0, "K"), (1, "V")):
            lines += [f"## {x}, {part} rows", "",
                      "| run | " + " | ".join(f"L{l}" for l in shown) + " |",
                      "|---|" + "---:|" * len(shown)]
            for run in runs:
                if run[3] != part:
                    continue
                cells = []
                for l in shown:
                    v = mean.get(run + (l,))
                    ref = mean.get((run[0], "reuse", 0.0, part, l))
                    if v is None:
                        cells.append("")
                    elif ref and run[1] != "reuse" and ref[xi] > 0:
                        cells.append(f"{v[xi]:.3f} ({100 * (v[xi] / ref[xi] - 1):+.0f}%)")
                    else:
                        cells.append(f"{v[xi]:.3f}")
                lines.append(f"| {label(run[0], run[1], run[2])} | " + " | ".join(cells) + " |")
            lines.append("")
    with open(os.path.join(out, "deviation.md"), "w") as f:
        f.write("\n".join(lines))
    print(os.path.join(out, "deviation.md"))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not found: plots skipped (use a Python with matplotlib, e.g. --python)", file=sys.stderr)
        return 0
    for part in ("context", "question"):
        for xi, x in ((0, "k"), (1, "v")):
            fig, ax = plt.subplots(figsize=(10, 6))
            for run in runs:
                if run[3] != part:
                    continue
                ys = [mean[run + (l,)][xi] for l in layers if run + (l,) in mean]
                style = "-" if run[0] == "prefixed" else "--"
                ax.plot(layers[:len(ys)], ys, style, label=label(run[0], run[1], run[2]), linewidth=1.2)
            ax.set_xlabel("layer (0-based)")
            ax.set_ylabel(f"relative L2 distance of {x.upper()} from full prefill")
            ax.set_title(f"{x.upper()} deviation, {part} rows, mean of {len(examples)} examples "
                         "(solid: prefixed, dashed: alone)")
            ax.legend(fontsize=7, ncol=2)
            ax.grid(alpha=0.3)
            fig.tight_layout()
            path = os.path.join(out, f"deviation_{part}_{x}.png")
            fig.savefig(path, dpi=110)
            plt.close(fig)
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Issue-16 ablation table from a `chunkfuse bench` results.jsonl (any plan, resumable runs).

usage: tools/ablation_report.py RESULTS_DIR [--base qcfuse] [--vs prophet,cacheblend,epic] [--out FILE]

Per (dataset, ratio, method or variant), over the examples that every listed row has
(complete examples only, so the columns are paired): mean fidelity F1 (answer vs full
prefill's), mean first-token KL(full || method), median TTFT and selection time (ms), mean
Jaccard overlap of the recomputed positions with the reference's (jaccard_ref column).
Then the paired difference base - other of fidelity with a 95% bootstrap interval
(tools/bench_report.py's resampling) for every other method/variant at that ratio.
Fidelity and KL are deterministic; timings are not (shared machine)."""
import argparse
import collections
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_report import bootstrap_mean_ci, read_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--base", default="qcfuse")
    ap.add_argument("--vs", default="", help="comma-separated: only these in the paired section (default: all)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = read_rows(os.path.join(a.dir, "results.jsonl"))
    cells = collections.defaultdict(dict)  # (dataset, model, ratio, method) -> example -> row
    full = collections.defaultdict(dict)
    for r in rows:
        key = (r["dataset"], r.get("model", ""))
        if r["method"] == "full":
            full[key][r["example"]] = r
            continue
        cells[key + (float(r["ratio"]), r["method"])][r["example"]] = r
    out = []
    groups = sorted({k[:3] for k in cells if 0 < k[2] < 1})
    for ds, model, ratio in groups:
        methods = {k[3]: v for k, v in cells.items() if k[:3] == (ds, model, ratio)}
        common = set.intersection(*(set(v) for v in methods.values()))
        common = sorted(common)
        if not common:
            continue
        out.append(f"\n### {ds} ({model}), ρ = {ratio:g}, n = {len(common)} examples\n")
        out.append("| method / variant | fidelity | KL | TTFT med ms | selection med ms | Jaccard vs ref | layers |")
        out.append("|---|---:|---:|---:|---:|---:|---|")
        order = sorted(methods, key=lambda m: (-statistics.mean(methods[m][e]["fidelity_f1"] for e in common), m))
        for m in order:
            rs = [methods[m][e] for e in common]
            jac = [r["jaccard_ref"] for r in rs if "jaccard_ref" in r]
            layers = rs[0].get("critical_layers", "")
            if isinstance(layers, list):
                layers = "all" if len(layers) > 8 else ",".join(map(str, layers))
            out.append(f"| {m} | {statistics.mean(r['fidelity_f1'] for r in rs):.3f} | "
                       f"{statistics.mean(r['kl'] for r in rs):.4f} | {statistics.median(r['ttft_ms'] for r in rs):.0f} | "
                       f"{statistics.median(r['selection_ms'] for r in rs):.1f} | "
                       f"{(statistics.mean(jac) if jac else float('nan')):.3f} | {layers} |")
        if a.base in methods:
            vs = [m for m in order if m != a.base and (not a.vs or m in a.vs.split(","))]
            series = [[methods[a.base][e]["fidelity_f1"] - methods[m][e]["fidelity_f1"] for e in common] for m in vs]
            cis = bootstrap_mean_ci(series)
            out.append(f"\nPaired fidelity difference {a.base} − other (95% bootstrap interval):\n")
            out.append("| other | Δ fidelity | interval |")
            out.append("|---|---:|---|")
            for m, s, (lo, hi) in zip(vs, series, cis):
                out.append(f"| {m} | {statistics.mean(s):+.3f} | [{lo:+.3f}, {hi:+.3f}] |")
    text = "\n".join(out) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()

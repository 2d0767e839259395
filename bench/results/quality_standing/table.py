"""The standing section's quality table from this folder's bench runs (run.sh): per file, full
prefill's gold F1 and median TTFT, then per method fidelity to full prefill / answers identical to
it (of n) / gold F1 / TTFT speed-up over full prefill; below the table, per file, the methods whose
paired 95% bootstrap interval of fidelity against the best excludes 0 (bench_report's paired.csv).
Usage: python3 bench/results/quality_standing/table.py > bench/results/quality_standing/table.md"""
import csv
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
FILES = [("qwen05", "Qwen 0.5B"), ("qwen15", "Qwen 1.5B"), ("gemma3", "Gemma 3 270M"), ("smollm2", "SmolLM2 135M")]
METHODS = [("reuse", "reuse"), ("epic", "EPIC"), ("cacheblend", "CacheBlend"), ("prophet", "ProphetKV"),
           ("qcfuse", "QCFuse"), ("fusionrag", "FusionRAG"), ("cachecraft", "Cache-Craft")]
NAMES = dict(METHODS)

print("| file (n) | full: gold F1, TTFT | " + " | ".join(name for _, name in METHODS) + " |")
print("|---|---|" + "---|" * len(METHODS))
notes = []
for key, label in FILES:
    summary = HERE / f"{key}_hotpotqa" / "summary.csv"
    if not summary.exists():
        continue
    rows = {r["method"]: r for r in csv.DictReader(open(summary))}
    full = rows["full"]
    n = int(full["n"])
    cells = []
    for method, _ in METHODS:
        r = rows.get(method)
        cells.append("-" if r is None else "%.3f / %d / %.3f / %.1fx" % (
            float(r["fidelity_f1"]), round(float(r["identical"]) * int(r["n"])), float(r["f1"]),
            float(r["speedup_vs_full"])))
    print(f"| {label} ({n}) | {float(full['f1']):.3f}, {float(full['ttft_median_ms']) / 1000:.2f} s | "
          + " | ".join(cells) + " |")
    paired = list(csv.DictReader(open(summary.parent / "paired.csv")))
    below = ["%s %+.3f [%+.3f, %+.3f]" % (NAMES.get(p["method"], p["method"]), float(p["d_fidelity"]),
                                           float(p["d_fidelity_lo"]), float(p["d_fidelity_hi"]))
             for p in paired if float(p["d_fidelity_hi"]) < 0]
    best = NAMES.get(paired[0]["best"], paired[0]["best"]) if paired else "-"
    notes.append(f"{label}: best fidelity at 0.15 {best}; separably below it (reuse, at 0, not in the test): "
                 + ("; ".join(below) if below else "none"))
print()
for line in notes:
    print("- " + line)

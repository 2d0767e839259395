#!/usr/bin/env python3
"""Issue 23 item 3: full prefill's gold-answer quality under each RAG prompt layout, paired by
example against a baseline folder (the same model and examples under another layout).

  python3 bench/results/issue23_layout/compare.py BASE_DIR NAME=DIR [NAME=DIR ...]

Each DIR is a `chunkfuse bench --methods full` output; only the examples present in BASE_DIR
and DIR are compared. Prints F1, EM, contains-gold (string_match), mean answer tokens, and the
mean paired F1 difference with a 95% bootstrap interval (tools/bench_report.py's)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools"))
import bench_report  # noqa: E402


def full_rows(d):
    rows = {}
    for line in open(os.path.join(d, "results.jsonl")):
        r = json.loads(line)
        if r["method"] == "full":
            rows[r["example"]] = r
    return rows


def mean(v):
    return sum(v) / len(v) if v else float("nan")


def main():
    base = full_rows(sys.argv[1])
    print("| layout | n | F1 | EM | contains gold | answer tokens | ends by itself | F1 - baseline [95% CI] |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for arg in sys.argv[2:]:
        name, d = arg.split("=", 1)
        rows = full_rows(d)
        common = sorted(set(rows) & set(base))
        for label, src in (("baseline", base), (name, rows)):
            if label == "baseline" and arg != sys.argv[2]:
                continue
            rs = [src[e] for e in common]
            diff = [rows[e]["f1"] - base[e]["f1"] for e in common]
            (lo, hi), = bench_report.bootstrap_mean_ci([diff])
            cell = "–" if label == "baseline" else bench_report.fmt_interval(mean(diff), lo, hi)
            print(f"| {label} | {len(rs)} | {mean([r['f1'] for r in rs]):.3f} | {mean([r['em'] for r in rs]):.3f} | "
                  f"{mean([r['string_match'] for r in rs]):.3f} | {mean([r['generated_tokens'] for r in rs]):.1f} | "
                  f"{sum(r['stop_reason'] != 'length' for r in rs)} | {cell} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Issue 60: quality against a first-token budget, auto (fusion.ttft_ms) against fixed methods.

  ttft_budget_curve.py budgets DIR [N]   N budgets (default 5), geometric from 1.5x reuse's median
                                         TTFT to 0.9x full prefill's, in DIR/results.jsonl; prints
                                         them comma-separated for `chunkfuse bench --ttft-budgets`
  ttft_budget_curve.py table DIR [...]   one markdown table per folder (a model's results) on stdout

Quality is the share of answers identical to full prefill's (answer == full_answer, as in
tools/bench_report.py and BENCHMARKS.md), with its 95% Wilson interval. A fixed (method, ratio)
meets a budget when its p90 TTFT (nearest rank over the examples) is at most the budget.
Standard library only (no plot: matplotlib is optional and absent here).
"""
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def rows_of(d):
    return [json.loads(l) for l in open(Path(d) / "results.jsonl") if l.strip()]


def p90(xs):
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.9 * len(xs)) - 1)]


def wilson(k, n, z=1.96):
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, c - h), min(1.0, c + h))


def budgets(d, n=5):
    rows = rows_of(d)
    med = {m: statistics.median(r["ttft_ms"] for r in rows if r["method"] == m) for m in ("full", "reuse")}
    lo, hi = 1.5 * med["reuse"], 0.9 * med["full"]
    return [round(lo * (hi / lo) ** (i / (n - 1)) / 10) * 10 for i in range(n)]


def groups(rows):
    g = defaultdict(list)
    for r in rows:
        key = ("auto", r["ratio"], "ms") if "ttft_budget_ms" in r else (r["method"], r["ratio"], "")
        if r["method"] == "auto" and "ttft_budget_ms" not in r:
            continue  # quality-target rows are not this curve's
        g[key].append(r)
    return g


def stats(rs):
    k = sum(1 for r in rs if r["answer"] == r["full_answer"])
    return {
        "n": len(rs),
        "k": k,
        "share": k / len(rs),
        "ci": wilson(k, len(rs)),
        "p90": p90([r["ttft_ms"] for r in rs]),
        "median": statistics.median(r["ttft_ms"] for r in rs),
        "fidelity": statistics.mean(r["fidelity_f1"] for r in rs),
    }


def fmt_share(s):
    return f"{s['share']:.3f} ({s['k']}/{s['n']}) [{s['ci'][0]:.2f}, {s['ci'][1]:.2f}]"


def table(d):
    rows = rows_of(d)
    g = groups(rows)
    st = {k: stats(v) for k, v in g.items()}
    model = rows[0]["model"]
    examples = {r["example"] for r in rows}
    out = [f"### {model}, {rows[0]['dataset']}, {len(examples)} examples ({Path(d).name}/)", ""]
    out.append("Fixed methods (identical to full [95% Wilson], fidelity F1, median / p90 TTFT ms):")
    out.append("")
    out.append("| method | ratio | identical | fidelity | median TTFT | p90 TTFT |")
    out.append("|---|---|---|---|---|---|")
    fixed = sorted((k for k in st if k[2] == ""), key=lambda k: st[k]["p90"])
    for k in fixed:
        s = st[k]
        out.append(f"| {k[0]} | {k[1]:g} | {fmt_share(s)} | {s['fidelity']:.3f} | {s['median']:.0f} | {s['p90']:.0f} |")
    out.append("")
    out.append("Auto at each budget against the best fixed (method, ratio) whose p90 TTFT meets it "
               "(ties in identical share broken by fidelity, then by lower p90):")
    out.append("")
    out.append("| budget ms | auto identical | auto fidelity | auto p90 / budget | auto median ms | auto's plans | "
               "best fixed meeting it | its identical | its fidelity | its p90 ms | auto >= best? |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in sorted((k for k in st if k[2] == "ms"), key=lambda k: k[1]):
        s = st[k]
        b = k[1]
        plans = defaultdict(int)
        for r in g[k]:
            a = r.get("auto") or {}
            plans[f"{a.get('method', '?')}@{a.get('ratio', '?')}"] += 1
        plan_text = ", ".join(f"{p} x{c}" for p, c in sorted(plans.items(), key=lambda x: -x[1]))
        meeting = [f for f in fixed if st[f]["p90"] <= b]
        if meeting:
            best = max(meeting, key=lambda f: (st[f]["k"], st[f]["fidelity"], -st[f]["p90"]))
            bs = st[best]
            verdict = "yes" if s["k"] >= bs["k"] else f"**no** ({s['k']} vs {bs['k']})"
            fixed_text = f"{best[0]}@{best[1]:g} | {fmt_share(bs)} | {bs['fidelity']:.3f} | {bs['p90']:.0f}"
        else:
            verdict = "(no fixed plan meets it)"
            fixed_text = "none | | |"
        within = "" if s["p90"] <= 1.1 * b else " (**over 1.1**)"
        out.append(f"| {b:g} | {fmt_share(s)} | {s['fidelity']:.3f} | {s['p90'] / b:.2f}{within} | {s['median']:.0f} | "
                   f"{plan_text} | {fixed_text} | {verdict} |")
    out.append("")
    return "\n".join(out)


def main(argv):
    if len(argv) >= 2 and argv[0] == "budgets":
        print(",".join(str(b) for b in budgets(argv[1], int(argv[2]) if len(argv) > 2 else 5)))
    elif len(argv) >= 2 and argv[0] == "table":
        print("\n".join(table(d) for d in argv[1:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

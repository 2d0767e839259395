#!/usr/bin/env python3
"""Report of a `chunkfuse bench` run: reads DIR/results.jsonl and writes

  DIR/report.md    one table per dataset (and model): method x ratio -> quality (F1 vs gold),
                   fidelity to full prefill (answer token F1, first-token agreement, KL),
                   TTFT median and p90, selection share of TTFT, speedup vs full prefill
  DIR/summary.csv  the same aggregates (and a few more) as CSV
  DIR/paired.csv   paired differences between selectors at each ratio (below)
  DIR/*.png        if matplotlib imports: quality vs TTFT per method (one curve per
                   method, as in the papers' figures) and TTFT phase bars, per dataset

Regenerating over an existing DIR/report.md keeps its "The earlier report of these rows ..."
lines (the machine of rows made before the bench recorded its kernels), in the header.

With DIR/peer.jsonl (bench/llamacpp_peer.py: llama.cpp's full-prefill TTFT of the same
prompt ids, same GGUF and threads) the tables add llama.cpp's median TTFT over the cell's
examples and speedup vs llama.cpp = that median / the method's median TTFT, over the
examples that have both.

Chunk contexts (bench --chunk-contexts, issue 14): rows of prefixed runs are reported
as their own dataset "<name> [prefixed]" (with full prefill's rows, shared); then two more
paired sections (DIR/paired_more.csv): every method x ratio on prefixed minus the same on
alone caches, and at ratio 0 every method minus reuse on the same chunk context (FusionRAG's
enriched caches against plain reuse), same bootstrap; selectors whose ratio-0 rows equal
reuse's (all but FusionRAG, by construction) are left out at ratio 0.

With --versus M1,M2 the paired section also compares each named method with every other
selector at each ratio strictly between 0 and 1 on the same chunk context (issue 16: QCFuse
against CacheBlend, EPIC and ProphetKV; issue 14: FusionRAG against the others). --versus
reuse instead compares every selector at each such ratio with reuse on its chunk context
(what recomputing that share buys over recomputing nothing).

Standard library only, matplotlib optional. Usage: bench_report.py DIR [--versus M1,M2]
Aggregates: means over examples, except TTFT and phases (median; p90 by linear
interpolation between order statistics). Selection share = sum(selection) / sum(TTFT).
Speedup = median TTFT of full prefill / median TTFT of the method, both over the method's
examples. F1 recovery = (F1 - F1_reuse) / (F1_full - F1_reuse) over the examples that have
all three, as FusionRAG reports it (undefined when full and reuse score the same).
Match = RULER's string match (share of the gold strings contained in the answer when all
are required, as in RULER's multi-value and variable-tracking tasks; else 1 if any is).

Paired differences (report section and DIR/paired.csv): at each ratio strictly between 0 and
1, the method with the highest mean fidelity among those that ran the most examples is the
reference (a partial run's mean is over other examples), and every other selector is compared
with it on the examples both ran: mean difference of fidelity F1 and of KL, with a
95% percentile bootstrap interval over examples (2,000 resamples, fixed seed, so reruns give
the same interval), and how many examples were better / worse. A cell-mean table alone
cannot say whether a 0.01 lead over 46 examples is real; this does.
"""
import csv
import json
import math
import os
import platform
import random
import statistics
import sys
from collections import Counter, OrderedDict, defaultdict

from benchlib import read_jsonl  # same folder


def quantile(values, q):
    """Linear interpolation between order statistics (numpy's default)."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = (len(v) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def mean(values):
    return sum(values) / len(values) if values else float("nan")


def read_rows(path):
    return read_jsonl(path, "bench_report")


def display_method(r):
    """auto's rows carry its quality target (bench --qualities: "auto q") or its first-token budget in
    milliseconds (--ttft-budgets: "auto ms") in the ratio slot."""
    if r["method"] != "auto":
        return r["method"]
    return "auto ms" if r.get("ttft_budget_ms") is not None else "auto q"


def method_order(rows):
    order = ["full", "reuse"]
    for r in rows:
        if display_method(r) not in order:
            order.append(display_method(r))
    return order


def peer_index(peer_rows):
    """(dataset, model, example, threads) -> llama.cpp TTFT ms (the latest row wins)."""
    return {(p["dataset"], p["model"], p["example"], int(p.get("threads", 0))): p["peer_ttft_ms"] for p in peer_rows}


def same_kernels(a, b):
    """Whether two rows' TTFTs were measured with the same kernels (the row's "isa"; rows
    written before it was recorded have none and compare only with each other)."""
    return a.get("isa") == b.get("isa")


def aggregate(rows, peer=None):
    """(dataset, model) -> list of per-(method, ratio) aggregate dicts, in display order."""
    peer = peer or {}
    groups = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[(r["dataset"], r.get("model", ""))][(display_method(r), float(r["ratio"]))].append(r)
    out = OrderedDict()
    for key in sorted(groups):
        cells = groups[key]
        order = method_order([r for rs in cells.values() for r in rs])
        # Baselines per example, so a cell is compared with full/reuse on its own examples
        # (a partial or resumed run has cells over different example sets).
        full_by = {r["example"]: r for rs in cells.values() for r in rs if r["method"] == "full"}
        reuse_by = {r["example"]: r for rs in cells.values() for r in rs if r["method"] == "reuse"}
        table = []
        for mr in sorted(cells, key=lambda mr: (order.index(mr[0]), mr[1])):
            rs = cells[mr]
            ttft = [r["ttft_ms"] for r in rs]
            med = quantile(ttft, 0.5)
            sum_ttft = sum(ttft)
            a = OrderedDict()
            a["dataset"], a["model"] = key
            a["method"], a["ratio"] = mr
            a["n"] = len(rs)
            a["f1"] = mean([r["f1"] for r in rs])
            a["em"] = mean([r["em"] for r in rs])
            a["rouge_l"] = mean([r["rouge_l"] for r in rs])
            a["string_match"] = mean([r["string_match"] for r in rs if "string_match" in r])
            a["fidelity_f1"] = mean([r["fidelity_f1"] for r in rs])
            a["identical"] = mean([1.0 if r.get("answer") == r.get("full_answer") else 0.0 for r in rs])
            a["first_token_agree"] = mean([1.0 if r["first_token_agree"] else 0.0 for r in rs])
            a["kl_mean"] = mean([r["kl"] for r in rs])
            a["kl_median"] = quantile([r["kl"] for r in rs], 0.5)
            a["ttft_median_ms"] = med
            a["ttft_p90_ms"] = quantile(ttft, 0.9)
            for phase in ("lookup", "load", "selection", "recompute"):
                a[f"{phase}_median_ms"] = quantile([r[f"{phase}_ms"] for r in rs], 0.5)
            a["selection_share"] = sum(r["selection_ms"] for r in rs) / sum_ttft if sum_ttft > 0 else float("nan")
            # A row whose full prefill ran on other kernels (a run resumed on another CPU) is
            # left out of the speed-up on both sides; rows that record no kernels pair together.
            timed = [r for r in rs if r["example"] not in full_by or same_kernels(r, full_by[r["example"]])]
            own_med = quantile([r["ttft_ms"] for r in timed], 0.5)
            full_ttft = quantile([full_by[r["example"]]["ttft_ms"] for r in timed if r["example"] in full_by], 0.5)
            a["speedup_vs_full"] = full_ttft / own_med if own_med > 0 and not math.isnan(full_ttft) else float("nan")
            with_peer = [(peer[k], r["ttft_ms"]) for r in rs
                         for k in [(r["dataset"], r.get("model", ""), r["example"], int(r.get("threads", 0)))] if k in peer]
            a["llama_ttft_median_ms"] = quantile([p for p, _ in with_peer], 0.5)
            own = quantile([t for _, t in with_peer], 0.5)
            a["speedup_vs_llama"] = a["llama_ttft_median_ms"] / own if with_peer and own > 0 else float("nan")
            a["recomputed_share"] = mean([r["recomputed_tokens"] / r["context_tokens"] for r in rs if r["context_tokens"]])
            a["context_tokens_mean"] = mean([r["context_tokens"] for r in rs])
            a["decode_tok_s_median"] = quantile([r["decode_tok_s"] for r in rs if r["decode_tok_s"] > 0], 0.5)
            a["method_offline_ms_mean"] = mean([r.get("method_offline_ms", 0.0) for r in rs])
            a["chunk_offline_ms_mean"] = mean([r.get("chunk_offline_ms", 0.0) for r in rs])
            paired = [r for r in rs if r["example"] in full_by and r["example"] in reuse_by]
            f1_full = mean([full_by[r["example"]]["f1"] for r in paired])
            f1_reuse = mean([reuse_by[r["example"]]["f1"] for r in paired])
            if paired and abs(f1_full - f1_reuse) > 1e-12:
                a["f1_recovery"] = (mean([r["f1"] for r in paired]) - f1_reuse) / (f1_full - f1_reuse)
            else:
                a["f1_recovery"] = float("nan")
            a["ttft_other_kernels"] = len(rs) - len(timed)
            table.append(a)
        out[key] = table
    return out


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def bootstrap_mean_ci(series, resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED, level=0.95):
    """Percentile bootstrap interval of the mean for each of several equally long series,
    resampling the same example indices for all of them (they are paired by example)."""
    n = len(series[0]) if series else 0
    if n == 0:
        return [(float("nan"), float("nan")) for _ in series]
    rng = random.Random(seed)
    means = [[] for _ in series]
    for _ in range(resamples):
        idx = rng.choices(range(n), k=n)
        for s, out in zip(series, means):
            out.append(sum(s[i] for i in idx) / n)
    tail = (1.0 - level) / 2.0
    return [(quantile(m, tail), quantile(m, 1.0 - tail)) for m in means]


def paired_differences(rows):
    """(dataset, model) -> list of dicts, one per (ratio, selector other than the best):
    mean paired difference (method - best) of fidelity F1 and of KL with bootstrap intervals."""
    cells = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        ratio = float(r["ratio"])
        if r["method"] in ("full", "reuse", "auto") or not 0.0 < ratio < 1.0:  # auto's ratio is a target
            continue
        cells[(r["dataset"], r.get("model", ""))][(ratio, r["method"])][r["example"]] = r
    out = OrderedDict()
    for key in sorted(cells):
        by_cell = cells[key]
        result = []
        for ratio in sorted({rm[0] for rm in by_cell}):
            methods = {m: by_cell[(ratio, m)] for (rt, m) in by_cell if rt == ratio}
            if len(methods) < 2:
                continue
            # The reference is the best mean fidelity among the methods that ran the most examples:
            # a stopped or partial run's mean is over fewer (other) examples, so not comparable.
            # Ties are broken by name so the reference does not depend on row order.
            most = max(len(by_example) for by_example in methods.values())
            best = max(sorted(m for m in methods if len(methods[m]) == most),
                       key=lambda m: mean([r["fidelity_f1"] for r in methods[m].values()]))
            for method in method_order([{"method": m} for m in sorted(methods)]):
                if method == best or method not in methods:
                    continue
                common = sorted(set(methods[method]) & set(methods[best]))
                if not common:
                    continue
                d_fid = [methods[method][e]["fidelity_f1"] - methods[best][e]["fidelity_f1"] for e in common]
                d_kl = [methods[method][e]["kl"] - methods[best][e]["kl"] for e in common]
                (fid_lo, fid_hi), (kl_lo, kl_hi) = bootstrap_mean_ci([d_fid, d_kl])
                result.append(OrderedDict([
                    ("dataset", key[0]), ("model", key[1]), ("ratio", ratio), ("best", best),
                    ("method", method), ("n", len(common)),
                    ("d_fidelity", mean(d_fid)), ("d_fidelity_lo", fid_lo), ("d_fidelity_hi", fid_hi),
                    ("better", sum(1 for d in d_fid if d > 0)), ("worse", sum(1 for d in d_fid if d < 0)),
                    ("d_kl", mean(d_kl)), ("d_kl_lo", kl_lo), ("d_kl_hi", kl_hi)]))
        out[key] = result
    return out


PREFIXED = " [prefixed]"


def chunk_context(row):
    """A row's chunk context, "alone" or "prefixed": the field "chunk_context", or in rows
    written before issue 25 "chunk_variant"; absent (full prefill, older rows): alone."""
    return row.get("chunk_context", row.get("chunk_variant", "alone"))


COPIED_FULL_ROW = "_copied_full_row"  # marks label_chunk_contexts' copies: not rows of the file


def label_chunk_contexts(rows):
    """Rows of prefixed runs under the dataset label '<name> [prefixed]', full prefill's rows
    copied there too (they do not depend on the chunk context)."""
    prefixed = {(r["dataset"], r.get("model", "")) for r in rows if chunk_context(r) == "prefixed"}
    out = []
    for r in rows:
        if chunk_context(r) == "prefixed":
            out.append(dict(r, dataset=r["dataset"] + PREFIXED))
            continue
        out.append(r)
        if r["method"] == "full" and (r["dataset"], r.get("model", "")) in prefixed:
            out.append(dict(r, dataset=r["dataset"] + PREFIXED, **{COPIED_FULL_ROW: True}))
    return out


def paired_more(rows, versus=()):
    """Paired (by example) differences: prefixed minus alone for every method x ratio, at
    ratio 0 every method minus reuse on the same context, and for each method named in
    `versus` (--versus) that method minus reuse on the other context at ratio 0 and minus every
    other selector on either context at each ratio strictly between 0 and 1; "reuse" in `versus`
    adds every selector at each such ratio minus reuse on the same context. Rows as labelled
    by label_chunk_contexts."""
    cell = defaultdict(dict)  # (dataset, model, context, method, ratio) -> example -> row
    for r in rows:
        if r["method"] == "auto":  # its ratio slot holds a quality target: no selector to pair with
            continue
        ds = r["dataset"]
        context = "prefixed" if ds.endswith(PREFIXED) else "alone"
        cell[(ds[: -len(PREFIXED)] if context == "prefixed" else ds, r.get("model", ""), context, r["method"],
              float(r["ratio"]))][r["example"]] = r

    def compare(kind, key, a, b, method, ratio):
        common = sorted(set(a) & set(b))
        if not common:
            return None
        d_fid = [a[e]["fidelity_f1"] - b[e]["fidelity_f1"] for e in common]
        d_kl = [a[e]["kl"] - b[e]["kl"] for e in common]
        d_tok = [float(a[e]["first_token_agree"]) - float(b[e]["first_token_agree"]) for e in common]
        (fl, fh), (kl_lo, kl_hi) = bootstrap_mean_ci([d_fid, d_kl])
        return OrderedDict([("dataset", key[0]), ("model", key[1]), ("comparison", kind), ("method", method),
                            ("ratio", ratio), ("n", len(common)), ("d_fidelity", mean(d_fid)),
                            ("d_fidelity_lo", fl), ("d_fidelity_hi", fh),
                            ("better", sum(1 for d in d_fid if d > 0)), ("worse", sum(1 for d in d_fid if d < 0)),
                            ("d_first_token", mean(d_tok)), ("d_kl", mean(d_kl)), ("d_kl_lo", kl_lo),
                            ("d_kl_hi", kl_hi)])

    def is_reuse(ds, model, context, method):  # a selector at ratio 0 that served plain reuse
        a, b = cell.get((ds, model, context, method, 0.0), {}), cell.get((ds, model, context, "reuse", 0.0), {})
        return method != "reuse" and bool(a) and all(
            e in b and a[e]["kl"] == b[e]["kl"] and a[e]["fidelity_f1"] == b[e]["fidelity_f1"] for e in a)

    out = []
    for (ds, model, context, method, ratio), a in sorted(cell.items()):
        if method == "full" or (ratio == 0 and is_reuse(ds, model, context, method)):
            continue
        if context == "prefixed" and (ds, model, "alone", method, ratio) in cell:
            d = compare("prefixed - alone", (ds, model), a, cell[(ds, model, "alone", method, ratio)], method, ratio)
            if d:
                out.append(d)
        if ratio == 0 and method != "reuse":
            # Reuse on the same context; for a --versus method also on the other one.
            for context2 in (context, "prefixed" if context == "alone" else "alone"):
                if (ds, model, context2, "reuse", 0.0) not in cell or (context2 != context and method not in versus):
                    continue
                label = (f"{method} - reuse ({context})" if context2 == context
                         else f"{method} ({context}) - reuse ({context2})")
                d = compare(label, (ds, model), a, cell[(ds, model, context2, "reuse", 0.0)], method, ratio)
                if d:
                    out.append(d)
        if "reuse" in versus and 0 < ratio < 1 and (ds, model, context, "reuse", 0.0) in cell:
            d = compare(f"{method} - reuse ({context})", (ds, model), a, cell[(ds, model, context, "reuse", 0.0)],
                        method, ratio)
            if d:
                out.append(d)
        if method in versus and 0 < ratio < 1:
            # Every other selector at this ratio, on either chunk context (the best configuration
            # of a method may be on the other context than the best of another).
            for (ds2, model2, context2, other, ratio2), b in sorted(cell.items()):
                if (ds2, model2, ratio2) != (ds, model, ratio) or other in (method, "full", "reuse"):
                    continue
                label = (f"{method} - {other} ({context})" if context2 == context
                         else f"{method} ({context}) - {other} ({context2})")
                d = compare(label, (ds, model), a, b, method, ratio)
                if d:
                    out.append(d)
    out.sort(key=lambda d: (d["dataset"], d["comparison"] == "prefixed - alone", d["method"], d["comparison"], d["ratio"]))
    return out


def paired_more_lines(diffs):
    if not diffs:
        return []
    lines = ["## Chunk contexts, ratio 0 and --versus, paired", "",
             "Mean paired difference over the examples both ran, 95% bootstrap interval (* = excludes 0); "
             "better / worse = examples with higher / lower fidelity; Δ 1st tok = difference of the "
             "first-token agreement rates. Negative Δ KL = closer to full prefill.", "",
             "| dataset | comparison | method | ρ | n | Δ fidelity | better / worse | Δ 1st tok | Δ KL |",
             "|---|---|---|---:|---:|---|---:|---:|---|"]
    for d in diffs:
        lines.append(f"| {d['dataset']} | {d['comparison']} | {d['method']} | {d['ratio']:g} | {d['n']} | "
                     f"{fmt_interval(d['d_fidelity'], d['d_fidelity_lo'], d['d_fidelity_hi'])} | "
                     f"{d['better']} / {d['worse']} | {d['d_first_token']:+.2f} | "
                     f"{fmt_interval(d['d_kl'], d['d_kl_lo'], d['d_kl_hi'], 4)} |")
    return lines + [""]


def fmt_interval(d, lo, hi, digits=3):
    """'+0.012 [-0.020, +0.041]', starred when the interval excludes 0."""
    star = "*" if lo > 0 or hi < 0 else ""
    return f"{d:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]{star}"


def fmt(x, digits=3):
    if isinstance(x, float):
        if math.isnan(x):
            return "–"
        return f"{x:.{digits}f}"
    return str(x)


def machine_line():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} hardware threads, {platform.system()} {platform.release()}"


def kernels_line(rows):
    """Which kernels timed the rows, from their `isa` field (the machine that ran them, which
    may not be the one making this report: a resumed bench folder can hold rows of several)."""
    counts = Counter(r.get("isa") or "not recorded" for r in rows)
    return ", ".join(f"{isa} {n}" for isa, n in sorted(counts.items()))


def context_tokens_per_example(rows):
    """Mean context length over the examples, each counted once: a mean of the table's per-cell
    means would weigh a method run on a few examples like one run on all of them."""
    per_example = defaultdict(list)
    for r in rows:
        per_example[r["example"]].append(r["context_tokens"])
    return mean([mean(v) for v in per_example.values()])


EARLIER_REPORT_PREFIX = "The earlier report of these rows"


def earlier_report_lines(report_path):
    """The lines of an existing report that name the machine an earlier report of these rows was
    made on: rows written before the bench recorded its kernels cannot tell it, so a regenerated
    report must carry that provenance forward instead of losing it."""
    try:
        with open(report_path, encoding="utf-8") as f:
            return [l.rstrip("\n") for l in f if l.startswith(EARLIER_REPORT_PREFIX)]
    except OSError:
        return []


def write_report(out_dir, rows, tables, plots, have_peer=False, paired=None, more=None):
    paired = paired or {}
    report_path = os.path.join(out_dir, "report.md")
    carried = earlier_report_lines(report_path)
    lines = ["# chunkfuse bench report", ""]
    cmd_file = os.path.join(out_dir, "bench_command.txt")
    if os.path.exists(cmd_file):
        with open(cmd_file, encoding="utf-8") as f:
            cmds = [l.strip() for l in f if l.strip()]
        if cmds:
            lines += ["Command (latest invocation; resumed runs append rows):", "", "```", cmds[-1], "```", ""]
    file_rows = [r for r in rows if not r.get(COPIED_FULL_ROW)]  # the header counts each row once
    threads = sorted({r.get("threads", 0) for r in file_rows})
    loads = [r["load_avg_1m"] for r in file_rows if r.get("load_avg_1m", -1) >= 0]
    lines.append(f"Rows timed with kernels: {kernels_line(file_rows)} (rows made before the bench recorded its "
                 f"kernels say 'not recorded'); threads used: {', '.join(map(str, threads))}; "
                 f"1-minute load average during the run: median {fmt(quantile(loads, 0.5), 2)}, "
                 f"max {fmt(max(loads) if loads else float('nan'), 2)}. Report made on: {machine_line()}.")
    lines += carried
    stores = sorted({r.get("store", "?") for r in file_rows})
    max_tokens = sorted({r.get("max_tokens", 0) for r in file_rows})
    lines += [f"Rows: {len(file_rows)}. Chunk store: {', '.join(stores)}. Greedy decoding, up to "
              f"{', '.join(map(str, max_tokens))} tokens, stopping at a newline.", ""]
    lines += ["Columns: F1/EM/ROUGE-L against the gold answers (LongBench normalisation, max over "
              "gold answers); fidelity = token F1 of the answer against full prefill's answer; ident. = share of "
              "answers identical to full prefill's; "
              "1st tok = share of examples whose first generated token equals full prefill's; "
              "KL = mean KL(full || method) of the first-token distributions; TTFT median and p90 "
              "(ms); sel. = share of TTFT spent in selection; speedup = full prefill's median TTFT / "
              "the method's, over the rows timed with the same kernels as their full prefill; "
              "recomp. = recomputed share of the context tokens; recovery = "
              "(F1 - F1_reuse) / (F1_full - F1_reuse); match = RULER string match (share of the gold "
              "strings in the answer where all are required, else 1 if any is)."
              + (" llama.cpp = median TTFT of llama.cpp's full prefill of the same prompt ids (same GGUF "
                 "and threads, bench/llamacpp_peer.py); vs llama.cpp = that / the method's median TTFT "
                 "over the same examples." if have_peer else ""), ""]
    for (dataset, model), table in tables.items():
        table_rows = [r for r in rows if r["dataset"] == dataset and r.get("model", "") == model]
        lines += [f"## {dataset} ({model}, {len({r['example'] for r in table_rows})} examples, "
                  f"{fmt(context_tokens_per_example(table_rows), 0)} context tokens on average)", ""]
        peer_head = " llama.cpp | vs llama.cpp |" if have_peer else ""
        lines.append("| method | ρ | n | F1 | EM | ROUGE-L | match | fidelity | ident. | 1st tok | KL | TTFT med | TTFT p90 "
                     "| sel. | speedup |" + peer_head + " recomp. | recovery |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                     + ("---:|---:|" if have_peer else "") + "---:|---:|")
        for a in table:
            peer_cells = (f" {fmt(a['llama_ttft_median_ms'], 1)} | {fmt(a['speedup_vs_llama'], 2)}x |"
                          if have_peer else "")
            lines.append(
                f"| {a['method']} | {a['ratio']:g} | {a['n']} | {fmt(a['f1'])} | {fmt(a['em'])} | "
                f"{fmt(a['rouge_l'])} | {fmt(a['string_match'])} | {fmt(a['fidelity_f1'])} | "
                f"{fmt(a['identical'], 2)} | {fmt(a['first_token_agree'], 2)} | "
                f"{fmt(a['kl_mean'], 4)} | {fmt(a['ttft_median_ms'], 1)} | {fmt(a['ttft_p90_ms'], 1)} | "
                f"{fmt(100 * a['selection_share'], 1)}% | {fmt(a['speedup_vs_full'], 2)}x |{peer_cells} "
                f"{fmt(100 * a['recomputed_share'], 1)}% | {fmt(a['f1_recovery'], 2)} |")
        other = sum(a["ttft_other_kernels"] for a in table)
        if other:
            kernels = sorted({r.get("isa", "unrecorded") for r in rows
                              if r["dataset"] == dataset and r.get("model", "") == model})
            lines += ["", f"Speed-ups leave out {other} rows whose full prefill ran with other kernels "
                          f"(this table's rows: {', '.join(kernels)}); their TTFT medians above include them."]
        lines.append("")
        lines.append("TTFT phases (median ms) and offline cost:")
        lines.append("")
        lines.append("| method | ρ | lookup | load | selection | recompute | decode tok/s | method offline ms/example |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for a in table:
            lines.append(f"| {a['method']} | {a['ratio']:g} | {fmt(a['lookup_median_ms'], 2)} | "
                         f"{fmt(a['load_median_ms'], 2)} | {fmt(a['selection_median_ms'], 2)} | "
                         f"{fmt(a['recompute_median_ms'], 1)} | {fmt(a['decode_tok_s_median'], 1)} | "
                         f"{fmt(a['method_offline_ms_mean'], 1)} |")
        chunk_ms = [r.get("chunk_offline_ms", 0.0) for r in rows
                    if r["dataset"] == dataset and r.get("model", "") == model and r["method"] == "full"]
        lines += ["", f"Chunk caches (offline, per example, computed in this run): mean "
                      f"{fmt(mean(chunk_ms), 1)} ms.", ""]
        diffs = paired.get((dataset, model), [])
        if diffs:
            lines += ["Paired differences from the best method at each ratio (the one with the highest "
                      "mean fidelity among the methods that ran the most examples), over the examples "
                      "both ran: mean of (method - best) with a 95% bootstrap interval (* = the "
                      "interval excludes 0); better/worse = examples where the method's fidelity is "
                      "higher/lower. A positive KL difference means the method's first-token "
                      "distribution is further from full prefill's.", "",
                      "| ρ | best | method | n | Δ fidelity | better / worse | Δ KL |",
                      "|---:|---|---|---:|---|---:|---|"]
            for d in diffs:
                lines.append(f"| {d['ratio']:g} | {d['best']} | {d['method']} | {d['n']} | "
                             f"{fmt_interval(d['d_fidelity'], d['d_fidelity_lo'], d['d_fidelity_hi'])} | "
                             f"{d['better']} / {d['worse']} | "
                             f"{fmt_interval(d['d_kl'], d['d_kl_lo'], d['d_kl_hi'], 4)} |")
            lines.append("")
        for p in plots.get((dataset, model), []):
            lines += [f"![{p}]({p})", ""]
    lines += paired_more_lines(more or [])
    with open(report_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def write_csv(out_dir, tables, name="summary.csv"):
    all_rows = [a for table in tables.values() for a in table]
    if not all_rows:
        return
    with open(os.path.join(out_dir, name), "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(all_rows[0].keys()))
        w.writeheader()
        for a in all_rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in a.items()})


def slug(s):
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in s)


def write_plots(out_dir, tables):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_report: matplotlib not found; no plots (pip install matplotlib)", file=sys.stderr)
        return {}
    plots = {}
    for (dataset, model), table in tables.items():
        names = []
        base = slug(dataset) + ("_" + slug(os.path.splitext(model)[0]) if len(tables) > 1 else "")
        # Quality (F1 and fidelity) against median TTFT, one curve per method over its ratios.
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        # Synthetic tasks are scored by string match (RULER), the QA sets by F1.
        quality = (("string_match", "string match vs gold") if dataset.startswith(("ruler:", "kv_retrieval"))
                   else ("f1", "F1 vs gold"))
        for ax, metric, label in ((axes[0],) + quality, (axes[1], "fidelity_f1", "fidelity to full prefill")):
            for method in method_order([{"method": a["method"]} for a in table]):
                pts = sorted((a["ttft_median_ms"], a[metric], a["ratio"]) for a in table if a["method"] == method)
                if not pts:
                    continue
                style = "*" if method in ("full", "reuse") else "o-"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=method, markersize=9 if len(pts) == 1 else 5)
                for x, y, r in pts:
                    if method not in ("full", "reuse"):
                        ax.annotate(f"{r:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
            ax.set_xlabel("TTFT median (ms)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=8)
        fig.suptitle(f"{dataset}: quality vs time to first token ({model})")
        fig.tight_layout()
        name = f"{base}_quality_vs_ttft.png"
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        names.append(name)
        # TTFT phases, stacked medians per method x ratio.
        fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(table) + 2), 4.2))
        labels = [f"{a['method']}\n{a['ratio']:g}" for a in table]
        bottom = [0.0] * len(table)
        for phase in ("lookup", "load", "selection", "recompute"):
            vals = [a[f"{phase}_median_ms"] for a in table]
            ax.bar(range(len(table)), vals, bottom=bottom, label=phase)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(table)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("median ms")
        ax.set_title(f"{dataset}: TTFT phases ({model})")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        name = f"{base}_ttft_phases.png"
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        names.append(name)
        plots[(dataset, model)] = names
    return plots


def main(argv):
    versus = ()
    if len(argv) == 4 and argv[2] == "--versus":
        versus = tuple(m for m in argv[3].split(",") if m)
        argv = argv[:2]
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = argv[1]
    path = os.path.join(out_dir, "results.jsonl")
    if not os.path.exists(path):
        print(f"bench_report: {path} not found", file=sys.stderr)
        return 1
    rows = read_rows(path)
    if not rows:
        print(f"bench_report: {path} has no rows", file=sys.stderr)
        return 1
    rows = label_chunk_contexts(rows)
    more = paired_more(rows, versus)
    peer_rows = read_rows(os.path.join(out_dir, "peer.jsonl")) if os.path.exists(os.path.join(out_dir, "peer.jsonl")) else []
    tables = aggregate(rows, peer_index(peer_rows))
    paired = paired_differences(rows)
    plots = write_plots(out_dir, tables)
    write_csv(out_dir, tables)
    write_csv(out_dir, paired, "paired.csv")
    if more:
        write_csv(out_dir, {"": more}, "paired_more.csv")
    write_report(out_dir, rows, tables, plots, have_peer=bool(peer_rows), paired=paired, more=more)
    print(f"bench_report: wrote {os.path.join(out_dir, 'report.md')}, summary.csv"
          + (", paired.csv" if any(paired.values()) else "")
          + (f" and {sum(len(v) for v in plots.values())} plots" if plots else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

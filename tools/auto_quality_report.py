#!/usr/bin/env python3
"""Report of the auto policy (issue 26) from `chunkfuse calibrate` outputs.

  tools/auto_quality_report.py signals RECORDS.jsonl...
      which cheap signals predict an answer identical to full prefill's, per ladder step: the
      ROC AUC of each (0.5 = no better than chance), over the given records. The predictor uses
      margin and entropy; the others are recorded to judge whether they would earn their cost.
  tools/auto_quality_report.py features CAL.jsonl HELD_OUT.jsonl [--questions DATASET.jsonl]
      whether signals beyond the predictor's would help: per ladder step, a logistic model of
      each feature set fitted on one split's records and scored (ROC AUC) on the other's, both
      ways round, the held-out scores pooled. Sets: the predictor's (margin, entropy); + how the
      first token moved from the previous ladder step (KL, top-1 equal); + the request's size
      (log context tokens, chunks); + the question's kind (yes/no, "which", length; needs
      --questions, the dataset file the records were made from); + how far the step's
      recomputation moved the K/V from the reuse step's cache (log mean relative change over
      the layers, K and V; over the context, or over the question's rows; records that have it);
      + the selector's score mass (log of its sum per question token, the share the recomputed
      rows hold: for ProphetKV and QCFuse, the probe's question-to-context attention).
  tools/auto_quality_report.py plot REPORT.json [REPORT.json...] --out FIG.png [--labels A,B,...]
      observed share of identical answers against mean TTFT: every fixed policy (points) and
      the auto policy over its targets (a curve), one panel per report (model / split); and
      the reliability table (predicted against observed, per step) as a second row.
  tools/auto_quality_report.py matrix REPORT.json... --label A --label B ... [--targets 0.8,0.9]
      issue 26's measure over several reports, one row per report and target: share [95%], mean
      and p90 TTFT, the cheapest fixed policy with that share, the speed-up over it, and the
      decision's cost as a share of the time saved.
  tools/auto_quality_report.py table REPORT.json
      the report as a Markdown table for BENCHMARKS.md (a cross-validated one, from `calibrate
      --cross-validate K`, lists each fold's plan).
"""
import argparse
import json
import math
import sys


def read_jsonl(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def auc(scores, labels):
    """ROC AUC by the rank-sum (Mann-Whitney) formula, ties counted half; None without both classes."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def signals(args):
    recs = read_jsonl(args.records)
    if not recs:
        sys.exit("no records")
    n_steps = len(recs[0]["steps"])
    print("%d records (%s)" % (len(recs), ", ".join(sorted({r["dataset"] for r in recs}))))
    print("| step | identical | margin | -entropy | -KL to previous step | top-1 = previous step's | answer = previous step's "
          "(share agreeing, identical among them) | context tokens (fewer) | -V change, context | -V change, question |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in range(n_steps):
        st = [r["steps"][k] for r in recs]
        y = [s["identical"] for s in st]
        cols = [auc([s["margin"] for s in st], y), auc([-s["entropy"] for s in st], y)]
        if k > 0:
            prev = [r["steps"][k - 1] for r in recs]
            cols.append(auc([-s["kl_to_prev"] for s in st], y))
            cols.append(auc([int(s["top1"] == p["top1"]) for s, p in zip(st, prev)], y))
            # The whole greedy answer of both steps: a signal that costs the previous step's
            # prefill and both answers' decoding, not measured by the predictor today.
            agree = [int(s["answer"] == p["answer"]) for s, p in zip(st, prev)]
            hits = sum(a and yy for a, yy in zip(agree, y))
            a = auc(agree, y)
            cols.append("%s (%.2f, %.2f)" % ("-" if a is None else "%.2f" % a, sum(agree) / len(agree),
                                             hits / max(1, sum(agree))))
        else:
            cols += [None, None, None]
        cols.append(auc([-r["context_tokens"] for r in recs], y))
        for part in ("context", "question"):  # less change, more likely identical
            ch = [kv_change(s, part) for s in st]
            cols.append(None if None in ch else auc([-c[1] for c in ch], y))
        fmt = lambda v: "-" if v is None else (v if isinstance(v, str) else "%.2f" % v)
        print("| %s %.2f | %.2f | %s |" % (st[0]["method"], st[0]["ratio"], sum(y) / len(y), " | ".join(fmt(c) for c in cols)))


def kv_change(step, part):
    """log of the step's mean relative K and V change over the layers against the reuse step's
    cache (`kv_change` in records made since 2026-11-27; part "context" or "question"), or
    None where the record has none (the reuse step itself, older records)."""
    c = step.get("kv_change")
    if c is None:
        return None
    mean = lambda xs: sum(xs) / len(xs)
    return [math.log(max(mean(c[part]["k"]), 1e-9)), math.log(max(mean(c[part]["v"]), 1e-9))]


def probe_mass(record, step):
    """The selector's score mass (`scores` in records made since 2026-11-27): log of its sum over
    the context per question token (ProphetKV / QCFuse: the probe's attention from the question
    to the context) and the share of it the recomputed rows hold; None where there is none."""
    sc = step.get("scores")
    if sc is None:
        return None
    return [math.log(max(sc["sum"], 1e-9) / max(record.get("question_tokens", 1), 1)), sc["selected_share"]]


YES_NO_WORDS = {"are", "is", "were", "was", "did", "do", "does", "can", "could", "has", "have"}


def solve(a, b):
    """a x = b by Gaussian elimination with partial pivoting (a small dense system)."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[piv] = m[piv], m[c]
        for r in range(n):
            if r != c and m[c][c] != 0:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] if m[i][i] != 0 else 0.0 for i in range(n)]


def logistic(w, x):
    z = w[0] + sum(wi * xi for wi, xi in zip(w[1:], x))
    return 1 / (1 + math.exp(-max(-60.0, min(60.0, z))))


def fit_logistic(x, y, l2=1.0):
    """As autoq::fit_logistic: Newton's method, L2 penalty on the weights but not the intercept."""
    d = len(x[0]) + 1
    w = [0.0] * d
    for _ in range(50):
        g = [0.0] * d
        h = [[0.0] * d for _ in range(d)]
        for row, label in zip(x, y):
            a = [1.0] + list(row)
            p = logistic(w, row)
            v = max(p * (1 - p), 1e-12)
            for i in range(d):
                g[i] += (p - label) * a[i]
                for j in range(d):
                    h[i][j] += v * a[i] * a[j]
        for i in range(1, d):
            g[i] += l2 * w[i]
            h[i][i] += l2
        h[0][0] += 1e-9
        w = [wi - si for wi, si in zip(w, solve(h, g))]
    return w


def features(args):
    folds = [read_jsonl([args.calibration]), read_jsonl([args.held_out])]
    questions = {}
    if args.questions:
        for row in read_jsonl([args.questions]):
            questions[str(row.get("_id", row.get("id")))] = row.get("question") or row.get("input") or ""

    def question_kind(r):
        text = questions.get(r["id"].split(":", 1)[-1], "")
        if not text:
            sys.exit("no question for %s in %s" % (r["id"], args.questions))
        first = text.split()[0].lower()
        return [float(first in YES_NO_WORDS), float(first == "which"), len(text.split()) / 20]

    sets = [("margin, entropy (the predictor)", lambda r, k: []),
            ("+ movement from the previous step", lambda r, k: [r["steps"][k]["kl_to_prev"],
                                                                 float(r["steps"][k]["top1"] == r["steps"][k - 1]["top1"])] if k else []),
            ("+ request size", lambda r, k: [math.log(r["context_tokens"]), r["chunks"]])]
    if questions:
        sets.append(("+ question kind", lambda r, k: question_kind(r)))
    if all(kv_change(r["steps"][k], "context") is not None for fold in folds for r in fold for k in range(1, len(r["steps"]))):
        sets.append(("+ recomputation's KV change, context", lambda r, k: kv_change(r["steps"][k], "context") or []))
        sets.append(("+ recomputation's KV change, question", lambda r, k: kv_change(r["steps"][k], "question") or []))
    if all(probe_mass(r, r["steps"][k]) is not None for fold in folds for r in fold for k in range(1, len(r["steps"]))):
        sets.append(("+ selector's score mass (sum, share selected)", lambda r, k: probe_mass(r, r["steps"][k]) or []))
    n_steps = len(folds[0][0]["steps"])
    names = ["%s %.2f" % (s["method"], s["ratio"]) for s in folds[0][0]["steps"]]
    print("held-out ROC AUC for \"identical\", %d + %d records, fitted on one split, scored on the other, both ways" %
          (len(folds[0]), len(folds[1])))
    print("| features | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * n_steps)
    for label, extra in sets:
        cells = []
        for k in range(n_steps):
            feats = lambda r: [r["steps"][k]["margin"], r["steps"][k]["entropy"]] + extra(r, k)
            scores, labels = [], []
            for train, test in ((folds[0], folds[1]), (folds[1], folds[0])):
                w = fit_logistic([feats(r) for r in train], [r["steps"][k]["identical"] for r in train])
                scores += [logistic(w, feats(r)) for r in test]
                labels += [r["steps"][k]["identical"] for r in test]
            a = auc(scores, labels)
            cells.append("-" if a is None else "%.2f" % a)
        print("| %s | %s |" % (label, " | ".join(cells)))


def step_name(key):
    """"prophet:0.050000" -> "prophet 0.05"; "full" stays."""
    method, _, ratio = key.partition(":")
    return method if not ratio else "%s %g" % (method, float(ratio))


def policy_text(pol):
    """A size class's plan at one target: the steps it runs and the p it accepts from."""
    steps = ", ".join(step_name(s) for s in pol.get("steps", [])) or "none (full prefill)"
    return steps if not pol.get("steps") else "%s; %.3f" % (steps, pol["threshold"])


def plans_text(plans):
    """A calibration's plans at one target, one per size class."""
    return "; ".join(("%d+ tokens: " % pol["min_context_tokens"] if len(plans) > 1 else "") + policy_text(pol) for pol in plans)


def fold_plans_text(fold_policies):
    """Cross-validated: the folds' plans grouped by the steps they run (per size class), each
    with the range of thresholds its folds accept from and how many folds chose it."""
    groups = {}
    for plans in fold_policies:
        key = tuple((pol["min_context_tokens"], tuple(pol["steps"])) for pol in plans)
        groups.setdefault(key, []).append(plans)
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        classes = []
        for c, (bound, steps) in enumerate(key):
            text = ", ".join(step_name(x) for x in steps) or "none (full prefill)"
            if steps:
                lo, hi = min(m[c]["threshold"] for m in members), max(m[c]["threshold"] for m in members)
                text += "; %.3f" % lo if hi - lo < 5e-4 else "; %.3f-%.3f" % (lo, hi)
            classes.append(("%d+ tokens: " % bound if len(key) > 1 else "") + text)
        out.append("%s (%d of %d folds)" % ("; ".join(classes), len(members), len(fold_policies)))
    return " / ".join(out)


def table(args):
    rep = json.load(open(args.report))
    cv = rep.get("cross_validation")
    print("%d examples (%s), model %s%s" % (rep["examples"], ", ".join(rep["datasets"]), rep["fingerprint"],
                                            "; %d-fold cross-validation, every request replayed by a calibration fitted "
                                            "without it (and on %d other records)" % (cv["folds"], cv["fitted_also_on"])
                                            if cv else ""))
    print()
    print("| policy | identical to full prefill [95%] | mean TTFT ms | p90 TTFT ms |")
    print("|---|---:|---:|---:|")
    for f in rep["fixed"]:
        print("| %s ρ %.2f | %.3f [%.3f, %.3f] | %.0f | %.0f |" % (f["method"], f["ratio"], f["share"], f["share_low"],
                                                                f["share_high"], f["mean_ttft_ms"], f["p90_ttft_ms"]))
    full = rep["fixed"][-1]["mean_ttft_ms"]
    bounds = rep.get("perfect_predictor", {})
    rows = [(name, bounds[name]) for name in ("clairvoyant", "ladder") if name in bounds]
    rows += [("%s ρ %.2f alone" % (b["method"], b["ratio"]), b) for b in bounds.get("single_step", [])]
    for name, b in rows:
        print("| perfect predictor (%s) | 1 | %.0f (%.2fx below full) | %.0f |" % (name, b["mean_ttft_ms"], full / b["mean_ttft_ms"],
                                                                               b["p90_ttft_ms"]))
    for t in rep["auto"]:
        print("| auto q %.2f | %.3f [%.3f, %.3f] | %.0f | %.0f |" % (t["target"], t["share"], t["share_low"],
                                                                 t["share_high"], t["mean_ttft_ms"], t["p90_ttft_ms"]))
    print()
    print("| target | share >= target (interval reaches it) | policy: steps run, accepted from p | answered by | decision ms (share of saved) "
          "| cheapest fixed with that share | its mean TTFT | speed-up |")
    print("|---:|---|---|---|---:|---|---:|---:|")
    for t in rep["auto"]:
        c = t["cheapest_fixed"]
        chosen = ", ".join("%s: %d" % (step_name(k), v) for k, v in sorted(t["chosen"].items()))
        if "fold_policies" in t:
            policy = fold_plans_text(t["fold_policies"])
        else:
            policy = plans_text(t.get("policies_by_size") or [t.get("policy", {})])
        share_of_saved = t["decision_share_of_saved"]
        share_of_saved = "nothing saved" if share_of_saved is None else "%.2f" % share_of_saved
        print("| %.2f | %s | %s | %s | %.0f (%s) | %s ρ %.2f | %.0f | %.2fx |" % (
            t["target"], ("yes" if t["meets_target"] else "**no**") + (
                "" if t.get("interval_reaches_target", t["meets_target"]) else ", interval below"), policy, chosen, t["decision_ms"],
            share_of_saved, c["method"], c["ratio"], c["mean_ttft_ms"], t["speedup_vs_cheapest_fixed"]))


def wilson(k, n, z=1.959964):
    if n == 0:
        return 0.0, 1.0
    p, z2n = k / n, z * z / n
    centre, half = (p + z2n / 2) / (1 + z2n), z * math.sqrt(p * (1 - p) / n + z2n / (4 * n)) / (1 + z2n)
    return max(0.0, centre - half), min(1.0, centre + half)


def pool(args):
    """Cross-validation: the reports of each fold's held-out split (same model and ladder), their
    requests pooled: shares with a Wilson interval over all, mean TTFT over all, and the
    cheapest pooled fixed policy reaching the pooled share."""
    reps = [json.load(open(p)) for p in args.reports]
    n = sum(r["examples"] for r in reps)
    fixed = []
    for i, f in enumerate(reps[0]["fixed"]):
        share = sum(r["fixed"][i]["share"] * r["examples"] for r in reps) / n
        mean = sum(r["fixed"][i]["mean_ttft_ms"] * r["examples"] for r in reps) / n
        fixed.append((f["method"], f["ratio"], share, mean))
    print("%d held-out requests over %d folds (model %s)" % (n, len(reps), reps[0]["fingerprint"]))
    print()
    print("| policy | identical to full prefill [95%] | mean TTFT ms | speed-up against the cheapest fixed policy with that share |")
    print("|---|---:|---:|---|")
    for method, ratio, share, mean in fixed:
        lo, hi = wilson(round(share * n), n)
        print("| %s ρ %.2f | %.3f [%.3f, %.3f] | %.0f | |" % (method, ratio, share, lo, hi, mean))
    for j, t in enumerate(reps[0]["auto"]):
        share = sum(r["auto"][j]["share"] * r["examples"] for r in reps) / n
        mean = sum(r["auto"][j]["mean_ttft_ms"] * r["examples"] for r in reps) / n
        decision = sum(r["auto"][j]["decision_ms"] * r["examples"] for r in reps) / n
        lo, hi = wilson(round(share * n), n)
        cheapest = min((f for f in fixed if f[2] >= share - 1e-9), key=lambda f: f[3])
        print("| auto q %.2f | %.3f [%.3f, %.3f] %s | %.0f (decision %.0f) | %s ρ %.2f, %.0f ms: %.2fx |" % (
            t["target"], share, lo, hi, "" if share >= t["target"] else ("(interval reaches it)" if hi >= t["target"] else "**below**"),
            mean, decision, cheapest[0], cheapest[1], cheapest[3], cheapest[3] / mean))


def plot(args):
    reps = [json.load(open(p)) for p in args.reports]
    labels = args.labels.split(",") if args.labels else []
    if labels and len(labels) != len(reps):
        sys.exit("--labels: %d names for %d reports" % (len(labels), len(reps)))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(reps), figsize=(5.5 * len(reps), 8), squeeze=False)
    for i, (path, rep) in enumerate(zip(args.reports, reps)):
        ax = axes[0][i]
        for f in rep["fixed"]:
            ax.errorbar(f["mean_ttft_ms"], f["share"], yerr=[[f["share"] - f["share_low"]], [f["share_high"] - f["share"]]],
                        fmt="o", capsize=3)
            ax.annotate("%s %.2f" % (f["method"], f["ratio"]), (f["mean_ttft_ms"], f["share"]), fontsize=7)
        xs = [t["mean_ttft_ms"] for t in rep["auto"]]
        ys = [t["share"] for t in rep["auto"]]
        ax.plot(xs, ys, "k-s", label="auto (targets %s)" % ", ".join("%.2f" % t["target"] for t in rep["auto"]))
        ax.set_xlabel("mean TTFT (ms)")
        ax.set_ylabel("answers identical to full prefill's")
        ax.set_title("%s\n%s, %d examples" % (labels[i] if labels else rep["fingerprint"], ", ".join(rep["datasets"]),
                                                rep["examples"]), fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[1][i]
        ax.plot([0, 1], [0, 1], "k:", lw=1)
        for r in rep["reliability"]:
            ax.plot([b["predicted"] for b in r["bins"]], [b["observed"] for b in r["bins"]], "o-",
                    label="%s %.2f" % (r["method"], r["ratio"]))
        ax.set_xlabel("predicted probability (bins of 0.1)")
        ax.set_ylabel("observed share identical")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print("wrote", args.out)


def matrix(args):
    """Issue 26's measure in one table: per report (a model on a dataset), per target, the share
    of identical answers with its interval, the auto policy's mean / p90 TTFT, the cheapest
    fixed policy reaching that share and the speed-up over it, and the decision's cost against
    the time it saved; then the issue's three targets checked per row."""
    labels = args.label
    if len(labels) != len(args.reports):
        sys.exit("--label: %d names for %d reports" % (len(labels), len(args.reports)))
    targets = [float(x) for x in args.targets.split(",")] if args.targets else None
    print("| model, dataset (held out) | n | target | identical [95%] | mean / p90 TTFT ms | cheapest fixed with that share "
          "| speed-up | decision / saved |")
    print("|---|---:|---:|---|---|---|---:|---:|")
    for label, path in zip(labels, args.reports):
        rep = json.load(open(path))
        for t in rep["auto"]:
            if targets and not any(abs(t["target"] - q) < 1e-9 for q in targets):
                continue
            c = t["cheapest_fixed"]
            mark = "" if t["meets_target"] else (" (interval reaches it)" if t.get("interval_reaches_target") else " **below**")
            cost = t["decision_share_of_saved"]
            # The speed target, marked where it is met with the share met too.
            bold = "**" if t["target"] in (0.9, 0.95) and t["speedup_vs_cheapest_fixed"] >= 1.3 and t["meets_target"] else ""
            print("| %s | %d | %.2f | %.3f [%.3f, %.3f]%s | %.0f / %.0f | %s ρ %.2f, %.0f | %s%.2fx%s | %s |" % (
                label, rep["examples"], t["target"], t["share"], t["share_low"], t["share_high"], mark, t["mean_ttft_ms"],
                t["p90_ttft_ms"], c["method"], c["ratio"], c["mean_ttft_ms"], bold, t["speedup_vs_cheapest_fixed"], bold,
                "-" if cost is None else "%.0f%%" % (100 * cost)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("signals")
    s.add_argument("records", nargs="+")
    s.set_defaults(fn=signals)
    f = sub.add_parser("features")
    f.add_argument("calibration")
    f.add_argument("held_out")
    f.add_argument("--questions")
    f.set_defaults(fn=features)
    t = sub.add_parser("table")
    t.add_argument("report")
    t.set_defaults(fn=table)
    c = sub.add_parser("pool")
    c.add_argument("reports", nargs="+")
    c.set_defaults(fn=pool)
    p = sub.add_parser("plot")
    p.add_argument("reports", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--labels", help="a title per report, comma-separated (default: the model's fingerprint)")
    p.set_defaults(fn=plot)
    m = sub.add_parser("matrix")
    m.add_argument("reports", nargs="+")
    m.add_argument("--label", action="append", required=True, help="a row name per report (model, dataset), once per report")
    m.add_argument("--targets", help="only these targets (comma-separated; default: every one in the reports)")
    m.set_defaults(fn=matrix)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()

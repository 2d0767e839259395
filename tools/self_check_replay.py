#!/usr/bin/env python3
"""Replays `serve --self-check` on recorded requests (issue 60 item 3): the auto policy at target
q walks each record (a `chunkfuse calibrate` records file: every ladder step's first-token
signals and whether its answer was identical to full prefill's) in order; a share of the answers
a step accepted is checked (the outcome is the record's), counted per plan, and a plan whose
Wilson 95% lower bound of identical answers falls below q after min_checks(q) checks leaves the
policy, as serve/self_check.cpp does. Checks are assumed done before the next request (a server
idle between requests); cold chunk caches and budgets are not modelled (the records are warm).

The rules mirror src/serve/self_check_ledger.cpp and fusion/auto_quality.cpp's walk; with
--share 0 the replay's share of identical answers is `chunkfuse calibrate --evaluate`'s (the
check that the walk is the engine's).

Usage: self_check_replay.py --calibration FILE --quality Q [--share S] RECORDS...
Prints the share of identical answers over all requests, before and after each recalibration.
"""
import argparse
import json
import math

Z = 1.96


def wilson_low(k, n):
    if n == 0:
        return 0.0
    p, z2 = k / n, Z * Z
    denom = 1 + z2 / n
    return max(0.0, ((p + z2 / (2 * n)) - Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))) / denom)


def min_checks(q):
    if q >= 1:
        return 20
    return max(20, math.ceil(Z * Z * q / (1 - q) - 1e-9))


def size_class(cal, tokens):
    found = cal["size_classes"][0]
    for c in cal["size_classes"]:
        if c["min_context_tokens"] <= tokens:
            found = c
    return found


def policy_for(cls, q):
    for p in cls["policies"]:
        if p["quality"] >= q - 1e-9:
            return p
    return {"steps": [], "threshold": 1.0, "quality": 1.0}


def predict(step, rec_step):
    w = step["weights"]
    z = w[0] + w[1] * rec_step["margin"] + w[2] * rec_step["entropy"]
    return 1 / (1 + math.exp(-z))


def replay(cal, records, q, share):
    removed = set()  # (class bound, policy quality, step) taken out
    ledger = {}  # step -> [checked, identical]
    seen = 0
    outcomes, events = [], []
    for i, rec in enumerate(records):
        cls = size_class(cal, rec["context_tokens"])
        pol = policy_for(cls, q)
        steps = [k for k in pol["steps"] if (cls["min_context_tokens"], pol["quality"], k) not in removed]
        by_step = {(s["method"], s["ratio"]): s for s in rec["steps"]}
        answered = None
        for k in steps:
            st = cal["steps"][k]
            r = by_step[(st["method"], st["ratio"])]
            if predict(st, r) >= pol["threshold"]:
                answered = (k, r["identical"])
                break
        if answered is None:
            outcomes.append(True)  # full prefill
            continue
        k, identical = answered
        outcomes.append(identical)
        seen += 1
        if math.floor(seen * share + 1e-9) <= math.floor((seen - 1) * share + 1e-9):
            continue
        rec_k = ledger.setdefault(k, [0, 0, False])
        rec_k[0] += 1
        rec_k[1] += identical
        if not rec_k[2] and rec_k[0] >= min_checks(q) and wilson_low(rec_k[1], rec_k[0]) < q:
            rec_k[2] = True
            # serve/self_check.cpp's without_step: the policy serving q, in every class
            for c in cal["size_classes"]:
                p = policy_for(c, q)
                removed.add((c["min_context_tokens"], p["quality"], k))
            events.append((i + 1, k, rec_k[0], rec_k[1]))
    return outcomes, events, ledger


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--quality", type=float, required=True)
    ap.add_argument("--share", type=float, default=0.2)
    ap.add_argument("records", nargs="+")
    a = ap.parse_args()
    cal = json.load(open(a.calibration))
    records = [json.loads(line) for path in a.records for line in open(path) if line.strip()]
    outcomes, events, ledger = replay(cal, records, a.quality, a.share)
    n = len(outcomes)
    print("requests %d, q %.2f, share %.2f: identical %.3f" % (n, a.quality, a.share, sum(outcomes) / n))
    for at, k, checked, same in events:
        st = cal["steps"][k]
        before, after = outcomes[:at], outcomes[at:]
        print("  after request %d: %s@%g recalibrated (%d/%d identical, lower bound %.3f); identical %.3f before, "
              "%.3f over the %d after" % (at, st["method"], st["ratio"], same, checked, wilson_low(same, checked),
                                          sum(before) / len(before), sum(after) / len(after) if after else float("nan"),
                                          len(after)))
    for k, (checked, same, fired) in sorted(ledger.items()):
        st = cal["steps"][k]
        print("  plan auto@%g:%s@%g: %d checked, %d identical%s" % (a.quality, st["method"], st["ratio"], checked, same,
                                                                   ", recalibrated" if fired else ""))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Issue 28's ratio column from bench/runtime_bench.py JSON files: per metric, ours / the faster
llama.cpp peer of each rep (repack or plain), median [min-max] over the reps.

  tools/runtime_ratio.py bench/results/runtime_issue28/*_t2_quiet2.json
"""
import json
import statistics
import sys


def rows(path):
    j = json.load(open(path))
    out = {}
    for m in j["summary"]:
        name = m["metric"]
        if "tok/s" not in name:
            continue
        ours = m["ours"]["values"]
        peers = [p["llama"]["values"] for p in m["peers"].values()]
        ratios = [o / max(p[i] for p in peers) for i, o in enumerate(ours)]
        out[name] = (statistics.median(ours), statistics.median(ratios), min(ratios), max(ratios))
    return j["meta"], out


def main():
    for path in sys.argv[1:]:
        meta, r = rows(path)
        cells = ["%.2f [%.2f-%.2f]" % v[1:] for v in r.values()]
        ours = " / ".join("%.0f" % v[0] for v in r.values())
        print("| %s | %s | %s | load %.1f/%.1f |" % (path.split("/")[-1], ours, " | ".join(cells),
                                                    meta["loadavg_1_5_15_before"][0], meta["loadavg_1_5_15_after"][0]))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Builds of build/bench_attention side by side: alternated round by round (the machine is
shared and drifts), median and range of each shape's G MAC/s per build.

Usage: ab.py [--filter REGEX] [--rounds N] NAME=PATH [NAME=PATH ...]
  e.g. ab.py --filter 'causal/.*/2048' --rounds 5 old=/tmp/bench_attention_old new=build/bench_attention
"""
import argparse
import collections
import re
import statistics
import subprocess


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--filter", default="causal/.*/2048", help="Google Benchmark filter (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds (default: %(default)s)")
    ap.add_argument("builds", nargs="+", metavar="NAME=PATH", help="a bench_attention binary and its label")
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.builds]
    if any(len(b) != 2 for b in builds):
        ap.error("each build is NAME=PATH")
    rates = collections.defaultdict(list)
    for _ in range(args.rounds):
        for name, path in builds:
            out = subprocess.run([path, f"--benchmark_filter={args.filter}"], capture_output=True, text=True,
                                 check=True).stdout
            for line in out.splitlines():
                m = re.match(r"causal/(\d+/\d+/\d+)/(\d+)/(\d+)/.*MAC/s=([\d.]+)G/s", line)
                if m:
                    rates[(f"heads {m.group(1)} rows {m.group(2)} entries {m.group(3)}", name)].append(float(m.group(4)))
    print(f"G MAC/s, median [min-max] of {args.rounds} alternated rounds")
    for shape in sorted({k[0] for k in rates}):
        cells = []
        for name, _ in builds:
            v = rates[(shape, name)]
            cells.append(f"{name} {statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}]")
        print(f"{shape}: " + "  ".join(cells))


if __name__ == "__main__":
    main()

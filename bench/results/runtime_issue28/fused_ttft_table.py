#!/usr/bin/env python3
"""Issue 28's fused-TTFT target: ours at rho 0.15 (every selector) against llama.cpp's full prefill
of the same prompt ids, per example, the faster of llama.cpp's two builds (extra buffer types =
weight repacking on / off; bench/llamacpp_peer.py). Prints a markdown table: median [min-max] over
the examples of peer TTFT / our TTFT.

Usage: python3 fused_ttft_table.py DIR   (DIR and DIR_plainpeer, written by fused_ttft.sh)
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
import benchlib  # noqa: E402


def rows(path: Path) -> list[dict]:
    return benchlib.read_jsonl(path, "fused_ttft_table")


def main() -> None:
    out = Path(sys.argv[1])
    ours = rows(out / "results.jsonl")
    repack = {r["example"]: r["peer_ttft_ms"] for r in rows(out / "peer.jsonl")}
    plain = {r["example"]: r["peer_ttft_ms"] for r in rows(Path(str(out) + "_plainpeer") / "peer.jsonl")}
    peer = {e: min(repack[e], plain[e]) for e in repack if e in plain}
    methods = []
    for r in ours:
        if r["method"] not in methods:
            methods.append(r["method"])
    tokens = [r["prompt_tokens"] for r in ours if r["method"] == "full"]
    print(f"{len(peer)} examples, prompt tokens median {statistics.median(tokens):.0f} "
          f"[{min(tokens)}-{max(tokens)}]; llama.cpp full prefill median {statistics.median(peer.values()) / 1000:.1f} s "
          f"(repack {statistics.median(repack.values()) / 1000:.1f} s, plain {statistics.median(plain.values()) / 1000:.1f} s)\n")
    print("| method | our TTFT median (s) | llama.cpp full prefill / ours: median [min-max] |")
    print("|---|---:|---:|")
    for m in methods:
        sel = [r for r in ours if r["method"] == m and r["example"] in peer]
        ratios = [peer[r["example"]] / r["ttft_ms"] for r in sel]
        ttft = statistics.median(r["ttft_ms"] for r in sel) / 1000
        label = m if m in ("full", "reuse") else f"{m} @ {sel[0]['ratio']}"
        print(f"| {label} | {ttft:.2f} | {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] |")


if __name__ == "__main__":
    main()

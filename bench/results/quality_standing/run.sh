#!/usr/bin/env bash
# The quality tables of BENCHMARKS.md's standing section, on the current code:
# every file at rho 0.15 on HotpotQA 0-39 (held out: the shipped calibrations and QCFuse profiles
# were fitted on HotpotQA 160-199 and musique_s 130-149), every selector and reuse against full
# prefill, greedy 32 tokens, warm chunk caches; fidelity / identical / gold F1 from bench_report.
# Usage: bash bench/results/quality_standing/run.sh [qwen05|qwen15|gemma3|smollm2 ...]  (resumable:
# bench skips rows already in its --out)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
models="${XDG_CACHE_HOME:-$HOME/.cache}/chunkfuse/models"
limit="${LIMIT:-40}"
files=("$@"); [ ${#files[@]} -gt 0 ] || files=(qwen05 gemma3 smollm2 qwen15)
for f in "${files[@]}"; do
  case "$f" in
    qwen05) model="$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" ;;
    qwen15) model="$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" ;;
    gemma3) model="$models/gemma-3-270m-q4_k_m.gguf" ;;
    smollm2) model="$models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
    *) echo "usage: $0 [qwen05|qwen15|gemma3|smollm2 ...]" >&2; exit 2 ;;
  esac
  out="$here/${f}_hotpotqa"
  echo "== $f: HotpotQA 0-$((limit - 1)) -> $out" >&2
  nice -n "${NICE:-0}" "$root/build/chunkfuse" bench -m "$model" --data hotpotqa --limit "$limit" \
    --methods full,reuse,epic,cacheblend,prophet,qcfuse,fusionrag,cachecraft --ratios 0.15 \
    --max-tokens 32 -t "${THREADS:-2}" --memory-store --memory-mb 1024 --no-report --out "$out"
  python3 "$root/tools/bench_report.py" "$out" > "$out/report.md"
done

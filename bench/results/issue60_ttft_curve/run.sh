#!/usr/bin/env bash
# Issue 60: quality against a first-token budget. Per model: full and reuse first (their median
# TTFTs on this machine set the budgets), then EPIC, CacheBlend, QCFuse at 0.05/0.15/0.3 and
# auto at 5 budgets (bench/ttft_budget_curve.py budgets), then the tables.
# Usage: bash bench/results/issue60_ttft_curve/run.sh qwen05|qwen15 LIMIT   (resumable)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
models="${XDG_CACHE_HOME:-$HOME/.cache}/chunkfuse/models"
case "$1" in
  qwen05) model="$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" ;;
  qwen15) model="$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" ;;
  *) echo "usage: $0 qwen05|qwen15 LIMIT" >&2; exit 2 ;;
esac
limit="$2"
out="$here/$1"
data="${DATA:-rgb_en_fact}"  # held out: the auto calibrations were fitted on HotpotQA 160-199
common=(-m "$model" --data "$data" --limit "$limit" --max-tokens 32 -t 2 --memory-store --memory-mb 1024
        --reference-cache /tmp/ttftcurve_refs --no-report --out "$out")
nice -n 19 "$root/build/chunkfuse" bench "${common[@]}" --methods full,reuse --ratios 0.15
budgets="$(python3 "$root/bench/ttft_budget_curve.py" budgets "$out")"
echo "budgets (ms): $budgets" | tee "$out/budgets.txt"
nice -n 19 "$root/build/chunkfuse" bench "${common[@]}" --methods epic,cacheblend,qcfuse,auto \
  --ratios 0.05,0.15,0.3 --ttft-budgets "$budgets"
python3 "$root/bench/ttft_budget_curve.py" table "$out" > "$out/table.md"
cat "$out/table.md"

#!/bin/bash
# Issue 28: fused TTFT at rho 0.15 on Qwen 1.5B against llama.cpp's full prefill of the same ids, 2 threads, quiet.
# Usage (repository root, after a Release build in build/): fused_ttft.sh avx2 .venv-avx2/bin/python;
# fused_ttft.sh avx512 .venv/bin/python; then python3 fused_ttft_table.py bench/results/runtime_issue28/qwen15_fused_ttft_ISA
set -e
cd "$(dirname "$0")/../../.."
M=${MODELS:-$HOME/.cache/chunkfuse/models}/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
ISA=$1; PEERPY=$2; OUT=bench/results/runtime_issue28/qwen15_fused_ttft_$ISA
CHUNKFUSE_ISA=$ISA build/chunkfuse bench -m $M --data hotpotqa --limit 8 --methods full,reuse,epic,cacheblend,prophet,qcfuse --ratios 0.15 \
  --max-tokens 4 -t 2 --memory-store --no-report --out $OUT
mkdir -p ${OUT}_plainpeer; cp $OUT/prompts.jsonl ${OUT}_plainpeer/
$PEERPY bench/llamacpp_peer.py $OUT --model $M --threads 2 --extra-bufts
$PEERPY bench/llamacpp_peer.py ${OUT}_plainpeer --model $M --threads 2
echo done

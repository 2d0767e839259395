#!/bin/bash
# Issues 28 and 23: fused TTFT at rho 0.15 on a Qwen file against llama.cpp's full prefill of the same ids, 2 threads, quiet.
# Usage (repository root, after a Release build in build/): fused_ttft.sh avx2 .venv-avx2/bin/python;
# fused_ttft.sh avx512 .venv/bin/python; then python3 fused_ttft_table.py bench/results/runtime_issue28/qwen15_fused_ttft_ISA
# MODEL=qwen05 runs the 0.5B file instead of the 1.5B (output qwen05_fused_ttft_ISA); LIMIT=N asks the
# first N HotpotQA examples (default 8); SUFFIX is appended to the output folder's name.
set -e
cd "$(dirname "$0")/../../.."
MODEL=${MODEL:-qwen15}
case $MODEL in
  qwen15) FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
  qwen05) FILE=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ;;
  *) echo "MODEL must be qwen15 or qwen05" >&2; exit 2 ;;
esac
M=${MODELS:-$HOME/.cache/chunkfuse/models}/$FILE
ISA=$1; PEERPY=$2; OUT=bench/results/runtime_issue28/${MODEL}_fused_ttft_$ISA${SUFFIX:-}
CHUNKFUSE_ISA=$ISA build/chunkfuse bench -m $M --data hotpotqa --limit ${LIMIT:-8} --methods full,reuse,epic,cacheblend,prophet,qcfuse --ratios 0.15 \
  --max-tokens 4 -t 2 --memory-store --no-report --out $OUT
mkdir -p ${OUT}_plainpeer; cp $OUT/prompts.jsonl ${OUT}_plainpeer/
$PEERPY bench/llamacpp_peer.py $OUT --model $M --threads 2 --extra-bufts
$PEERPY bench/llamacpp_peer.py ${OUT}_plainpeer --model $M --threads 2
echo done

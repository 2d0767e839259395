#!/bin/bash
# Issue 57: the prefill GEMM against the machine's int8 peak, whole prefills against llama.cpp,
# and the panel GEMM against the kernels it replaced, side by side, 2 threads.
# Usage (repository root, Release build in build/, scripts/setup.sh --bench done):
#   bench/results/runtime_issue57/run.sh peak      # chunkfuse perf --peak per file and ISA
#   bench/results/runtime_issue57/run.sh llama     # bench/runtime_bench.py per file (ours vs llama.cpp)
#   BASE=c6099dd bench/results/runtime_issue57/run.sh ab   # this tree vs BASE (the llama.cpp-order
#                                                  # kernels), built in a worktree, perf alternated
# MODELS (default ~/.cache/chunkfuse/models), FILES (default: the four real files), REPS (3),
# ISAS (peak: default "avx512 avx2"; on an AMX host "amx avx512"), SUFFIX (added to the result
# files' names, e.g. _xeon, so that one CPU kind's results do not overwrite another's).
SUFFIX=${SUFFIX:-}
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=bench/results/runtime_issue57
MODELS=${MODELS:-$HOME/.cache/chunkfuse/models}
FILES=${FILES:-"SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m qwen2.5-coder-0.5b-instruct-q4_k_m qwen2.5-coder-1.5b-instruct-q4_k_m"}
REPS=${REPS:-3}
case "${1:-}" in
  peak)
    for f in $FILES; do for isa in ${ISAS:-avx512 avx2}; do
      CHUNKFUSE_ISA=$isa build/chunkfuse perf -m "$MODELS/$f.gguf" --peak --prompt-tokens 512,2048 --gen-tokens 32 -t 2 --json \
        > "$OUT/peak_${f}_$isa$SUFFIX.json"
      echo "$f $isa: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['peak']['gemm'], [round(p['tok_per_s'],1) for p in d['prefill']])" "$OUT/peak_${f}_$isa$SUFFIX.json")"
    done; done ;;
  llama)
    for f in $FILES; do
      .venv/bin/python bench/runtime_bench.py --model "$MODELS/$f.gguf" --reps "$REPS" --out "$OUT/llama_$f$SUFFIX.json" \
        > "$OUT/llama_$f$SUFFIX.md"
      cat "$OUT/llama_$f$SUFFIX.md"
    done ;;
  ab)
    BASE=${BASE:-c6099dd}
    wt=/tmp/chunkfuse-base-$BASE
    [[ -d $wt ]] || git worktree add --detach "$wt" "$BASE"
    (source scripts/lib.sh; CF_REPO_ROOT=$wt; cd "$wt"; CF_TARGETS=chunkfuse cf_build build Release >/dev/null)
    for f in $FILES; do for rep in $(seq "$REPS"); do for side in base new; do
      bin=build/chunkfuse; [[ $side == base ]] && bin=$wt/build/chunkfuse
      "$bin" perf -m "$MODELS/$f.gguf" --prompt-tokens 512,2048 --gen-tokens 32 -t 2 --json 2>/dev/null |
        python3 -c "import json,sys; d=json.load(sys.stdin); print('$f', '$side', $rep, *[round(p['tok_per_s'],1) for p in d['prefill']], round(d['decode']['tok_per_s'],1))"
    done; done; done | tee "$OUT/ab_$BASE.txt" ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac

# Issue 28: chunkfuse against llama.cpp on every real file and the SmolLM2 variants, for each ISA
# this machine offers, 2 threads, alternated reps, both peers (repack, plain):
#   avx2    ours capped by CHUNKFUSE_ISA=avx2 against llama-cpp-python 0.3.36 built for AVX2 only
#           (.venv-avx2, bench/README.md "An AVX2 peer"; on a CPU without AVX-512, the native .venv)
#   avx512  ours native against the native build (.venv)
# Each side waits until no other process is runnable before it starts (--wait-quiet: the machine
# is shared). Run from the repository root after a Release build of chunkfuse in $BUILD (default
# build); ISAS, FILES, REPS, PROMPTS narrow it. Output: one JSON per (file, ISA) beside this script.
set -euo pipefail
cd "$(dirname "$0")/../../.."
M=${MODELS:-$HOME/.cache/chunkfuse/models}
BUILD=${BUILD:-build}
REPS=${REPS:-2}
PROMPTS=${PROMPTS:-512,2048}
declare -A FILE=(
  [smollm2_q4_1]="$M/SmolLM2-135M-Instruct.Q4_1.gguf"
  [smollm2_q4_k_m]="$M/variants/SmolLM2-135M-Instruct.Q4_1.Q4_K_M.gguf"
  [smollm2_q4_0]="$M/variants/SmolLM2-135M-Instruct.Q4_1.Q4_0.gguf"
  [smollm2_q8_0]="$M/variants/SmolLM2-135M-Instruct.Q4_1.Q8_0.gguf"
  [gemma3_270m]="$M/gemma-3-270m-q4_k_m.gguf"
  [qwen05]="$M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
  [qwen15]="$M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
)
FILES=${FILES:-"smollm2_q4_1 smollm2_q4_k_m smollm2_q4_0 smollm2_q8_0 gemma3_270m qwen05 qwen15"}
ISAS=${ISAS:-"avx2 avx512"}
out=bench/results/runtime_issue28
mkdir -p bench/out
for f in $FILES; do
  for isa in $ISAS; do
    peer=.venv/bin/python
    # On a CPU with AVX-512 the AVX2 column needs a peer built for AVX2 only; on an AVX2-only
    # CPU the native build (.venv) is that peer.
    [[ $isa == avx2 ]] && grep -qw avx512f /proc/cpuinfo && peer=.venv-avx2/bin/python
    echo "== $f $isa" >&2
    .venv/bin/python bench/runtime_bench.py --binary "$BUILD/chunkfuse" --model "${FILE[$f]}" --threads "${THREADS:-2}" \
      --isa "$isa" --peer-python "$peer" --peers repack,plain --reps "$REPS" --prompt-tokens "$PROMPTS" \
      --gen-tokens 64 --wait-quiet ${WAIT_QUIET:-15} --out "$out/${f}_${isa}_t${THREADS:-2}${SUFFIX:-}.json" 2>>bench/out/runtime_issue28.err | tail -7
  done
done

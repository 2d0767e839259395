# The runtime matrix of docs/benchmarks-history.md (issue 11). MODELS: a folder with SmolLM2 requantized
# by llama.cpp (bench/runtime_bench.py --make-variants makes them); the shape files come from
# scripts/setup.sh --shapes (--with-8b for the 8B row). Run from the repository root.
MODELS=${MODELS:-$HOME/.cache/chunkfuse/models/variants}
cd "$(dirname "$0")/../../.."
mkdir -p bench/out
run() { name=$1; shift; echo "=== $name $(date +%T)"; .venv/bin/python bench/runtime_bench.py --peers repack,plain --out bench/results/runtime_issue11/$name.json "$@" 2>>bench/out/runtime_issue11.err | tail -14; }
run smollm2_q4_1 --reps 3 --prompt-tokens 2048 --gen-tokens 64
run smollm2_q4_k_m --model $MODELS/smollm2-135m.Q4_K_M.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 64
run smollm2_q8_0 --model $MODELS/smollm2-135m.Q8_0.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 64
run smollm2_q4_0 --model $MODELS/smollm2-135m.Q4_0.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 64
run qwen2_5_0_5b_q4_k_m --model $HOME/.cache/chunkfuse/models/shapes/qwen2.5-0.5b.Q4_K_M.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 32
run llama3_2_1b_q4_k_m --model $HOME/.cache/chunkfuse/models/shapes/llama3.2-1b.Q4_K_M.gguf --reps 2 --prompt-tokens 2048 --gen-tokens 32
run llama3_1_8b_q4_k_m --model $HOME/.cache/chunkfuse/models/shapes/llama3.1-8b.Q4_K_M.gguf --reps 1 --prompt-tokens 512 --gen-tokens 16
echo DONE $(date +%T)

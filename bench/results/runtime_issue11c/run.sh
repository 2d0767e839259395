# The issue-11 runtime rows after the file-width Q5_0/Q5_1/Q5_K/Q6_K tiles, the 8 KiB prefetch, the
# once-per-block V conversion and vector mask in attention, the AVX-512 Q8_K quantizer and the
# slab-wise repacking at load (commit of this
# folder). Same tool as ../runtime_issue11/run.sh; MODELS: SmolLM2 requantized by llama.cpp
# (bench/runtime_bench.py --make-variants), the shape files from scripts/setup.sh --shapes
# (--with-8b for the 8B row), Gemma from scripts/setup.sh --models gemma3.
# Run from the repository root.
MODELS=${MODELS:-$HOME/.cache/chunkfuse/models/variants}
CACHE=$HOME/.cache/chunkfuse/models
cd "$(dirname "$0")/../../.."
mkdir -p bench/out
run() { name=$1; shift; echo "=== $name $(date +%T)"; .venv/bin/python bench/runtime_bench.py --peers repack,plain --out bench/results/runtime_issue11c/$name.json "$@" 2>>bench/out/runtime_issue11c.err | tail -9; }
run llama3_2_1b_q4_k_m --model $CACHE/shapes/llama3.2-1b.Q4_K_M.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 32
run gemma3_270m_q4_k_m --model $CACHE/gemma-3-270m-q4_k_m.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 64
run smollm2_q4_k_m --model $MODELS/SmolLM2-135M-Instruct.Q4_1.Q4_K_M.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 64
run smollm2_q8_0 --model $MODELS/SmolLM2-135M-Instruct.Q4_1.Q8_0.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 64
run smollm2_q4_0 --model $MODELS/SmolLM2-135M-Instruct.Q4_1.Q4_0.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 64
run smollm2_q4_1 --reps 3 --prompt-tokens 2048 --gen-tokens 64
run qwen2_5_0_5b_q4_k_m --model $CACHE/shapes/qwen2.5-0.5b.Q4_K_M.gguf --reps 3 --prompt-tokens 2048 --gen-tokens 32
run llama3_1_8b_q4_k_m --model $CACHE/shapes/llama3.1-8b.Q4_K_M.gguf --reps 1 --prompt-tokens 512 --gen-tokens 16
echo DONE $(date +%T)

# The issue-11 rows for F16 and BF16 weights: SmolLM2-135M-Instruct requantized by llama.cpp's
# quantizer (tools/make_shape_models.py --requantize SRC --types F16,BF16 --no-ref, the files
# tools/check_file_types.sh also makes), 3 alternated reps against both llama.cpp peers. A fusion
# bench running on the machine was stopped (SIGSTOP) for the whole run. Run from the repository root;
# SUFFIX=_x names the output files smollm2_f16_x.json (the rows after the kernel change: _462ef79).
MODELS=${MODELS:-$HOME/.cache/chunkfuse/models/variants}
cd "$(dirname "$0")/../../.."
mkdir -p bench/out
for t in F16 BF16; do
  lower=$(echo "$t" | tr A-Z a-z)
  .venv/bin/python bench/runtime_bench.py --peers repack,plain --model "$MODELS/SmolLM2-135M-Instruct.Q4_1.$t.gguf" \
    --reps 3 --prompt-tokens 2048 --gen-tokens 64 --out "bench/results/runtime_issue11d/smollm2_$lower${SUFFIX:-}.json" \
    2>>bench/out/runtime_issue11d.err | tail -9
done

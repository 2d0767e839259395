#!/usr/bin/env bash
# Agreement with llama.cpp on every file type a user may bring: the default model requantized
# by llama.cpp's own quantizer (allow-requantize) to each type, a golden fixture made by
# llama.cpp on that file (tools/make_golden.py), and the golden tests of the default model
# (build/test_runtime --gtest_filter='Golden.*', bounds from docs/ARCHITECTURE.md's "Numerics
# contract"; a file type without an f64 fixture takes SmolLM2 Q4_1's) run against it. Needs scripts/setup.sh
# --bench (.venv with llama-cpp-python) and a Release build. docs/benchmarks-history.md, "Every file type".
#
#   tools/check_file_types.sh                      # the default list below
#   tools/check_file_types.sh F16 BF16             # only these
#
# Files: $XDG_CACHE_HOME/chunkfuse/models/variants/ (models, made once) and
# build/file-type-fixtures/ (fixtures, made once; delete to regenerate).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$CF_REPO_ROOT"

types=("$@")
((${#types[@]})) || types=(Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K_M Q5_K_M Q6_K F16 BF16)
py=.venv/bin/python
[[ -x $py ]] || cf_die "no .venv: run scripts/setup.sh --bench"
[[ -x build/test_runtime ]] || cf_die "no build/test_runtime: build the Release tree first (scripts/test.sh or ninja -C build)"
source_model="${CHUNKFUSE_MODEL:-$(cf_cache_root)/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[[ -f $source_model ]] || cf_die "no source model at $source_model (run scripts/setup.sh)"
variants="$(cf_cache_root)/models/variants"
fixtures=build/file-type-fixtures
mkdir -p "$variants" "$fixtures"
stem=$(basename "$source_model" .gguf)

failed=()
for t in "${types[@]}"; do
  model="$variants/$stem.$t.gguf"
  fixture="$fixtures/$stem.$t.json"
  [[ -f $model ]] || "$py" tools/make_shape_models.py --requantize "$source_model" --types "$t" --no-ref --out "$variants"
  [[ -f $fixture ]] || "$py" tools/make_golden.py --model "$model" --out "$fixture" >/dev/null
  if out=$(CHUNKFUSE_MODEL="$model" CHUNKFUSE_GOLDEN_FIXTURE="$fixture" build/test_runtime --gtest_filter='Golden.*' 2>&1); then
    verdict=within
  else
    verdict=outside
    failed+=("$t")
  fi
  # The test's own summary lines: logit differences, top-1 agreement, greedy continuations.
  printf '%-7s %-9s %s\n' "$t" "$verdict" "$(grep -E '^(top-10|identical greedy)' <<<"$out" | paste -sd ';' -)"
done
((${#failed[@]} == 0)) || cf_die "outside the golden tests' bounds against llama.cpp (see the lines above): ${failed[*]}"

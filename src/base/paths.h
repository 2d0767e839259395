// Where chunkfuse keeps its files: the model cache filled by scripts/setup.sh and,
// later, the chunk-cache store. Both honour XDG_CACHE_HOME.
#pragma once
#include <string>

namespace cf {
std::string cache_root();          // $XDG_CACHE_HOME/chunkfuse or ~/.cache/chunkfuse
std::string default_model_path();  // $CHUNKFUSE_MODEL, else <cache_root>/models/<default file>
// The smallest model that answers well (Qwen2.5-Coder-0.5B-Instruct Q4_K_M; docs/benchmarks-history.md,
// issue 23), fetched by scripts/setup.sh; scripts/lib.sh names the same file. The unit tests
// keep SmolLM2-135M (tests/test_support.cpp).
inline constexpr const char* kDefaultModelFile = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
// SmolLM2-135M-Instruct Q4_1, also always fetched (scripts/lib.sh CF_TEST_MODEL_FILE): the
// fast model of the unit tests and of the fuzz targets, whose fixtures are made for it.
inline constexpr const char* kTestModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
}  // namespace cf

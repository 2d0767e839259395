// Where chunkfuse keeps its files: the model cache filled by scripts/setup.sh and,
// later, the chunk-cache store. Both honour XDG_CACHE_HOME.
#pragma once
#include <string>

namespace cf {
std::string cache_root();          // $XDG_CACHE_HOME/chunkfuse or ~/.cache/chunkfuse
std::string default_model_path();  // $CHUNKFUSE_MODEL, else <cache_root>/models/<default file>
inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
}  // namespace cf

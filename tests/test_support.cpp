#include "test_support.h"

#include <cstdlib>
#include <filesystem>

#include "base/paths.h"

namespace cf::test {

// SmolLM2-135M-Instruct Q4_1, not the engine's default model: the fast model of the unit
// tests, whose fixtures (smollm2_q4_1.json) and expectations are made for it.
std::string default_model_path() {
  if (const char* env = std::getenv("CHUNKFUSE_MODEL"); env && *env) return env;
  return cf::cache_root() + "/models/" + cf::kTestModelFile;
}

bool have_default_model() { return std::filesystem::exists(default_model_path()); }

std::string source_dir() { return CHUNKFUSE_SOURCE_DIR; }

std::string fixture_path(const std::string& name) { return source_dir() + "/tests/golden/" + name; }

std::string shared_datasets_dir() {
  // CHUNKFUSE_DATA_DIR first, as the engine's own datasets do (issue 24: it was ignored here).
  if (const char* env = std::getenv("CHUNKFUSE_DATA_DIR"); env && *env) return std::filesystem::is_directory(env) ? env : "";
  for (const char* up : {"/../shared/datasets", "/../../shared/datasets"})  // a worktree under /work/wt/<name>
    if (std::filesystem::is_directory(source_dir() + up)) return source_dir() + up;
  return "";
}

std::string gemma3_model_path() {
  if (const char* env = std::getenv("CHUNKFUSE_GEMMA3_MODEL"); env && *env) return env;
  return cf::cache_root() + "/models/gemma-3-270m-q4_k_m.gguf";
}

bool have_gemma3_model() { return std::filesystem::exists(gemma3_model_path()); }

std::string qwen05_model_path() {
  if (const char* env = std::getenv("CHUNKFUSE_QWEN05_MODEL"); env && *env) return env;
  return cf::cache_root() + "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
}

bool have_qwen05_model() { return std::filesystem::exists(qwen05_model_path()); }

std::string qwen15_model_path() {
  if (const char* env = std::getenv("CHUNKFUSE_QWEN15_MODEL"); env && *env) return env;
  return cf::cache_root() + "/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
}

bool have_qwen15_model() { return std::filesystem::exists(qwen15_model_path()); }

}  // namespace cf::test

// Shared helpers for the test binaries: where the default model and fixtures live.
#pragma once
#include <cstdlib>
#include <string>

namespace cf::test {
// Path of the tests' model, SmolLM2-135M-Instruct Q4_1 (CHUNKFUSE_MODEL, else the setup
// script's cache location; the engine's own default is Qwen2.5-Coder-0.5B). Tests that need it call GTEST_SKIP() only when CHUNKFUSE_ALLOW_NO_MODEL is
// set; otherwise a missing model is a failure, so CI cannot pass without running them.
std::string default_model_path();
bool have_default_model();
std::string source_dir();             // repository root
std::string fixture_path(const std::string& name);  // tests/golden/<name>
// ../shared/datasets beside the repository (or beside a worktree's parent); "" when absent.
std::string shared_datasets_dir();
// The second real model, Gemma 3 270M Q4_K_M (scripts/setup.sh --models gemma3):
// $CHUNKFUSE_GEMMA3_MODEL, else <cache_root>/models/gemma-3-270m-q4_k_m.gguf.
std::string gemma3_model_path();
bool have_gemma3_model();
// Qwen2.5-Coder-0.5B-Instruct Q4_K_M (scripts/setup.sh --models qwen2.5-0.5b; in CI):
// $CHUNKFUSE_QWEN05_MODEL, else <cache_root>/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.
std::string qwen05_model_path();
bool have_qwen05_model();
// Qwen2.5-Coder-1.5B-Instruct Q4_K_M (--models qwen2.5-1.5b; not in CI: its tests are a
// manual check, skipped when the file is absent): $CHUNKFUSE_QWEN15_MODEL, else the cache.
std::string qwen15_model_path();
bool have_qwen15_model();
}  // namespace cf::test

// As CF_REQUIRE_MODEL, for the Qwen 0.5B file.
#define CF_REQUIRE_QWEN05()                                                                           \
  do {                                                                                                \
    if (!::cf::test::have_qwen05_model()) {                                                           \
      if (std::getenv("CHUNKFUSE_ALLOW_NO_MODEL")) GTEST_SKIP() << "no Qwen 0.5B model";              \
      FAIL() << "Qwen2.5 0.5B model not found at " << ::cf::test::qwen05_model_path()                 \
             << " (run scripts/setup.sh --models qwen2.5-0.5b or set CHUNKFUSE_QWEN05_MODEL)";        \
    }                                                                                                 \
  } while (0)

// The 1.5B's tests are a manual check (CI does not fetch the 1.1 GB file): they skip, saying
// how to run them, when it is absent.
#define CF_REQUIRE_QWEN15_MANUAL()                                                                   \
  do {                                                                                               \
    if (!::cf::test::have_qwen15_model())                                                            \
      GTEST_SKIP() << "manual check: Qwen2.5 1.5B not at " << ::cf::test::qwen15_model_path()          \
                   << " (scripts/setup.sh --models qwen2.5-1.5b, then ctest -R Qwen15Manual)";       \
  } while (0)

// As CF_REQUIRE_MODEL, for the Gemma 3 file.
#define CF_REQUIRE_GEMMA3()                                                                           \
  do {                                                                                                \
    if (!::cf::test::have_gemma3_model()) {                                                           \
      if (std::getenv("CHUNKFUSE_ALLOW_NO_MODEL")) GTEST_SKIP() << "no Gemma 3 model";                \
      FAIL() << "Gemma 3 model not found at " << ::cf::test::gemma3_model_path()                      \
             << " (run scripts/setup.sh --models gemma3 or set CHUNKFUSE_GEMMA3_MODEL)";              \
    }                                                                                                 \
  } while (0)

#define CF_REQUIRE_MODEL()                                                        \
  do {                                                                            \
    if (!::cf::test::have_default_model()) {                                      \
      if (std::getenv("CHUNKFUSE_ALLOW_NO_MODEL")) GTEST_SKIP() << "no model";     \
      FAIL() << "default model not found at " << ::cf::test::default_model_path() \
             << " (run scripts/setup.sh or set CHUNKFUSE_MODEL)";                 \
    }                                                                             \
  } while (0)

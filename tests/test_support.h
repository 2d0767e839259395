// Shared helpers for the test binaries: where the default model and fixtures live.
#pragma once
#include <cstdlib>
#include <string>

namespace cf::test {
// Path of the default GGUF model (CHUNKFUSE_MODEL, else the setup script's cache
// location). Tests that need it call GTEST_SKIP() only when CHUNKFUSE_ALLOW_NO_MODEL is
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
}  // namespace cf::test

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

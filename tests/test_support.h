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
}  // namespace cf::test

#define CF_REQUIRE_MODEL()                                                        \
  do {                                                                            \
    if (!::cf::test::have_default_model()) {                                      \
      if (std::getenv("CHUNKFUSE_ALLOW_NO_MODEL")) GTEST_SKIP() << "no model";     \
      FAIL() << "default model not found at " << ::cf::test::default_model_path() \
             << " (run scripts/setup.sh or set CHUNKFUSE_MODEL)";                 \
    }                                                                             \
  } while (0)

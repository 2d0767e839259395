#include "test_support.h"

#include <filesystem>

#include "base/paths.h"

namespace cf::test {

std::string default_model_path() { return cf::default_model_path(); }

bool have_default_model() { return std::filesystem::exists(default_model_path()); }

std::string source_dir() { return CHUNKFUSE_SOURCE_DIR; }

std::string fixture_path(const std::string& name) { return source_dir() + "/tests/golden/" + name; }

}  // namespace cf::test

#include "base/paths.h"

#include <cstdlib>

namespace cf {

std::string cache_root() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/chunkfuse";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/chunkfuse";
}

std::string default_model_path() {
  if (const char* p = std::getenv("CHUNKFUSE_MODEL"); p && *p) return p;
  return cache_root() + "/models/" + kDefaultModelFile;
}

}  // namespace cf

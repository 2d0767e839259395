// QCFuse critical-layer profiles that ship with the project (issue 11, item 5): one
// data/qcfuse_profiles/<model fingerprint>.qcfuse.json per real model the project knows,
// compiled into the binary by CMakeLists.txt, so `chunkfuse ask --method qcfuse` on a fresh
// install runs with the layers the benchmarks were measured with. A profile in the cache
// (chunkfuse profile-layers) takes precedence.
#pragma once
#include "fusion/bundled_files.h"

namespace cf::qcfuse {
using BundledProfile = BundledFile;
}  // namespace cf::qcfuse

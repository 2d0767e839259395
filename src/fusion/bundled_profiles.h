// QCFuse critical-layer profiles that ship with the project (issue 11, item 5): one
// data/qcfuse_profiles/<model fingerprint>.qcfuse.json per real model the project knows,
// compiled into the binary by CMakeLists.txt, so `chunkfuse ask --method qcfuse` on a fresh
// install runs with the layers the benchmarks were measured with. A profile in the cache
// (chunkfuse profile-layers) takes precedence.
#pragma once

namespace cf::qcfuse {

struct BundledProfile {
  const char* fingerprint;  // Model::fingerprint_hex(); nullptr ends the table
  const char* file;         // repository path, for messages
  const char* json;         // the profile, format chunkfuse.qcfuse.profile/1
};

extern const BundledProfile kBundledProfiles[];

}  // namespace cf::qcfuse

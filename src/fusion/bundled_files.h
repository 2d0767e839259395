// Model-specific files that ship with the project, compiled into the binary by
// CMakeLists.txt (cf_bundle_json): one data/<folder>/<model fingerprint><suffix> per real
// model the project knows, so a fresh install runs with what the benchmarks were measured
// with. A file in the user's cache takes precedence over a bundled one.
#pragma once

namespace cf {

struct BundledFile {
  const char* fingerprint;  // Model::fingerprint_hex() (plus any infix before the suffix); nullptr ends a table
  const char* file;         // repository path, for messages
  const char* json;         // the file's text
};

namespace qcfuse {
// data/qcfuse_profiles/*.qcfuse.json (format chunkfuse.qcfuse.profile/1; critical_layers.cpp).
extern const BundledFile kBundledProfiles[];
}  // namespace qcfuse

namespace autoq {
// data/auto_calibrations/*.auto.json (format chunkfuse.auto.calibration/2; auto_quality.h).
extern const BundledFile kBundledCalibrations[];
}  // namespace autoq

}  // namespace cf

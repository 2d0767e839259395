// Inline bodies shared by the multi-versioned kernels of the runtime.
#pragma once
#include <cstdint>
#include <cstring>

#define CF_MULTIVERSION __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))

namespace cf::detail {

// e^x = 2^n * 2^f with n = round(x log2 e), |f| <= 1/2, 2^f by its Taylor series to degree 7
// (truncation error < 1e-8). Branch-free so that loops over it vectorize.
inline float exp_inline(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float t = x * 1.44269504088896341f;
  const float n = __builtin_roundf(t);
  const float f = (t - n) * 0.693147180559945309f;  // in [-ln2/2, ln2/2]
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace cf::detail

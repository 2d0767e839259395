// f16 <-> float rows 8 at a time with F16C, shared by the AVX2 and AVX-512 runtime kernels
// (both compiled with -mf16c); the callers finish the tail with the scalar forms. Internal
// linkage: each including file compiles it with its own flags.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace cf::rk {
namespace {

// Exact (every f16 is a float). Returns how many it converted: n rounded down to 8.
inline size_t f16c_to_f32_prefix(const uint16_t* __restrict x, float* __restrict y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  return i;
}

// Round to nearest even, infinity beyond the f16 range. Returns how many it converted.
inline size_t f32_to_f16c_prefix(const float* __restrict x, uint16_t* __restrict y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}

}  // namespace
}  // namespace cf::rk

// vpdpbusd zmm: 16 lanes x 4 multiply-adds; ten independent accumulators cover its latency.
// GCC 12 reports its own _mm512_undefined_* helpers as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "model/int8_peak.h"

namespace cf::kern {

double int8_peak_loop_avx512(long iterations, int& checksum) {
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
  // Ten named accumulators (an array would live on the stack and turn each step into a
  // load and a store).
  // Each starts at its own value, or the compiler sees ten equal chains and keeps one.
  __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2), c3 = _mm512_set1_epi32(3),
          c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5), c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7),
          c8 = _mm512_set1_epi32(8), c9 = _mm512_set1_epi32(9);
  for (long n = 0; n < iterations; ++n) {
    c0 = _mm512_dpbusd_epi32(c0, a, b); c1 = _mm512_dpbusd_epi32(c1, a, b); c2 = _mm512_dpbusd_epi32(c2, a, b);
    c3 = _mm512_dpbusd_epi32(c3, a, b); c4 = _mm512_dpbusd_epi32(c4, a, b); c5 = _mm512_dpbusd_epi32(c5, a, b);
    c6 = _mm512_dpbusd_epi32(c6, a, b); c7 = _mm512_dpbusd_epi32(c7, a, b); c8 = _mm512_dpbusd_epi32(c8, a, b);
    c9 = _mm512_dpbusd_epi32(c9, a, b);
  }
  const __m512i s = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                       _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7))),
      _mm512_add_epi32(c8, c9));
  checksum = _mm512_reduce_add_epi32(s);
  return static_cast<double>(iterations) * 10 * 64;
}

}  // namespace cf::kern

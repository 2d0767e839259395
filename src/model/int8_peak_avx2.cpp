// vpmaddubsw + vpaddw on ymm (16 int16 pairs: 32 multiply-adds per pair of instructions),
// the AVX2 GEMM's inner step (it widens the int16 sums to int32 only every few groups);
// ten independent accumulators.
#include <immintrin.h>

#include "model/int8_peak.h"

namespace cf::kern {

double int8_peak_loop_avx2(long iterations, int& checksum) {
  __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(2);
  // Ten named accumulators (an array would live on the stack and turn each step into a
  // load and a store).
  // Each starts at its own value, or the compiler sees ten equal chains and keeps one.
  __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2), c3 = _mm256_set1_epi32(3),
          c4 = _mm256_set1_epi32(4), c5 = _mm256_set1_epi32(5), c6 = _mm256_set1_epi32(6), c7 = _mm256_set1_epi32(7),
          c8 = _mm256_set1_epi32(8), c9 = _mm256_set1_epi32(9);
  // The barrier makes each step's operand "new", so that no step's product is shared.
  auto step = [&](__m256i c) {
    asm volatile("" : "+x"(b));
    return _mm256_add_epi16(c, _mm256_maddubs_epi16(a, b));
  };
  for (long n = 0; n < iterations; ++n) {
    c0 = step(c0); c1 = step(c1); c2 = step(c2); c3 = step(c3); c4 = step(c4);
    c5 = step(c5); c6 = step(c6); c7 = step(c7); c8 = step(c8); c9 = step(c9);
  }
  const __m256i s = _mm256_add_epi32(
      _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                       _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7))),
      _mm256_add_epi32(c8, c9));
  alignas(32) int lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  checksum = 0;
  for (int v : lanes) checksum += v;
  return static_cast<double>(iterations) * 10 * 32;
}

uint64_t read_sum_avx2(const uint8_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a;
  for (size_t i = 0; i < n; i += 64) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(a, b));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

}  // namespace cf::kern

// exp on vectors: ggml's expf (runtime_kernels_scalar.h's exp_inline, the softmax's and
// SiLU's exp), the same float operations lane by lane, per ISA. Internal linkage: each
// including file compiles it with its own flags.
#pragma once
#include <immintrin.h>

#include <limits>

namespace cf::rk {
namespace {

#if defined(__AVX2__)
// exp_inline's argument reduction and polynomial on 8 lanes: x = n ln2 + b, j ~ e^b; z is
// x log2(e) + 1.5 x 2^23, whose low mantissa bits hold n.
struct Exp8Parts {
  __m256 z, n, j;
};
inline Exp8Parts exp8_parts(__m256 x) {
  const __m256 shift = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
  const __m256 n = _mm256_sub_ps(z, shift);
  // fma(-n, c, x) == fnmadd(n, c, x): (-n) c is -(n c) exactly.
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
  return {z, n, j};
}

// exp_inline on 8 lanes, the same float operations in the same order (GCC does not
// vectorize the scalar form for AVX2: the SiLU and softmax loops ran it one value at a time).
inline __m256 exp8(__m256 x) {
  const auto [z, n, j] = exp8_parts(x);
  const __m256 n_clamped = _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-192.0f)), _mm256_set1_ps(192.0f));
  const __m256i ni = _mm256_cvttps_epi32(n_clamped);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, s1), s2);
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 out_of_range = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  const __m256 edge = _mm256_blendv_ps(_mm256_set1_ps(std::numeric_limits<float>::infinity()), _mm256_setzero_ps(),
                                       _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
  return _mm256_blendv_ps(res, edge, out_of_range);
}

// exp of a softmax's x - max (x <= 0, or a lane masked off afterwards): exp8's polynomial with
// one scale 2^n, n in [-126, 0], where exp8 guards both ends with two scales and blends (about
// 10 fewer operations). x is clamped at -87 (its result ~1.4 x 2^-126, never a denormal: those
// cost a microcode assist on Intel; exp8 goes on to 0), invisible beside the maximum's 1 in a
// softmax's sum; a positive x gives garbage, which the caller's mask drops.
inline __m256 exp8_nonpositive(__m256 x) {
  // A NaN lane (masked) becomes -87 too.
  const auto [z, n, j] = exp8_parts(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)));
  // z's low mantissa bits hold n + 2^22: adding 127 there and shifting gives 2^n.
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(z), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(j, _mm256_castsi256_ps(scale));
}
#endif

#if defined(__AVX512F__)
// exp on 16 lanes: ggml's expf polynomial (runtime_kernels_scalar.h's exp_inline), the edges
// (|n| > 192, -inf) as 0 or infinity.
inline __m512 exp16(__m512 x) {
  const __m512 shift = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift);
  const __m512 n = _mm512_sub_ps(z, shift);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                      _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
  const __m512 res = _mm512_scalef_ps(j, _mm512_max_ps(n, _mm512_set1_ps(-192.0f)));
  const __mmask16 out_of_range = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_NLE_UQ);
  const __mmask16 low = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ) | _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512 edge = _mm512_mask_blend_ps(low, _mm512_set1_ps(std::numeric_limits<float>::infinity()), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(out_of_range, res, edge);
}

#endif

}  // namespace
}  // namespace cf::rk

// AVX-512 VNNI kernels. One zmm holds 16 output rows x 4 k-bytes; vpdpbusd multiplies the
// unsigned weight bytes (Q4_1 nibbles, Q8_0 stored as w+128) by the broadcast signed
// activation bytes. Up to 8 activation rows share each unpacked weight block.
// Per-lane float arithmetic is the same sequence as the portable kernel (bit-identical).
// GCC 12 reports its own _mm512_undefined_* helpers as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "model/kernels_impl.h"

namespace cf::kern {
namespace {

inline float fp16_round_f16c(float f) {
  return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

void quantize_q8_avx512(const float* x, size_t cols, uint8_t* out, bool q8_1) {
  const size_t nb = cols / kQK;
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* dv = reinterpret_cast<float*>(out + nb * kQK);
  float* sv = dv + nb;
  int32_t* cv = reinterpret_cast<int32_t*>(out + nb * kQK + nb * 4);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (size_t b = 0; b < nb; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + b * kQK), v1 = _mm512_loadu_ps(x + b * kQK + 16);
    const __m512 mx = _mm512_max_ps(_mm512_and_ps(v0, abs_mask), _mm512_and_ps(v1, abs_mask));
    const float amax = _mm512_reduce_max_ps(mx);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 mul = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * kQK), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * kQK + 16), _mm512_cvtsepi32_epi8(q1));
    // Sum of the saturated bytes (saturation never triggers: |x*id| <= 127).
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    dv[b] = fp16_round_f16c(d);
    if (q8_1)
      sv[b] = fp16_round_f16c(d * static_cast<float>(sum));
    else
      cv[b] = -128 * sum;
  }
}

inline __m512i bcast32(const int8_t* p) { return _mm512_set1_epi32(load_i32(p)); }

template <int R>
inline void q4_1_rows(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, float* y, size_t y_stride,
                      __mmask16 store_mask) {
  __m512 acc[R];
  const int8_t* xq[R];
  const float* xd[R];
  const float* xs[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    xq[r] = a.qs(r0 + r);
    xd[r] = a.d(r0 + r);
    xs[r] = a.s(r0 + r);
  }
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = tile + b * kQ4_1TileBlock;
    __m512i w[8];
    for (int g = 0; g < 4; ++g) {
      const __m512i v = _mm512_loadu_si512(wb + 64 * g);
      w[g] = _mm512_and_si512(v, low4);
      w[g + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256)));
    const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 288)));
    for (int r = 0; r < R; ++r) {
      const int8_t* q = xq[r] + b * kQK;
      // w[g] holds elements 4g..4g+3 of each row for g < 8 (high nibbles are 16 + ...).
      __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast32(q + 0));
      __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast32(q + 4));
      s0 = _mm512_dpbusd_epi32(s0, w[2], bcast32(q + 8));
      s1 = _mm512_dpbusd_epi32(s1, w[3], bcast32(q + 12));
      s0 = _mm512_dpbusd_epi32(s0, w[4], bcast32(q + 16));
      s1 = _mm512_dpbusd_epi32(s1, w[5], bcast32(q + 20));
      s0 = _mm512_dpbusd_epi32(s0, w[6], bcast32(q + 24));
      s1 = _mm512_dpbusd_epi32(s1, w[7], bcast32(q + 28));
      const __m512 sumf = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      acc[r] = _mm512_fmadd_ps(sumf, _mm512_mul_ps(dw, _mm512_set1_ps(xd[r][b])), acc[r]);
      acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[r][b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * y_stride, store_mask, acc[r]);
}

template <int R>
inline void q8_0_rows(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, float* y, size_t y_stride,
                      __mmask16 store_mask) {
  __m512 acc[R];
  const int8_t* xq[R];
  const float* xd[R];
  const int32_t* xc[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    xq[r] = a.qs(r0 + r);
    xd[r] = a.d(r0 + r);
    xc[r] = a.corr(r0 + r);
  }
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = tile + b * kQ8_0TileBlock;
    __m512i w[8];
    for (int g = 0; g < 8; ++g) w[g] = _mm512_loadu_si512(wb + 64 * g);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 512)));
    for (int r = 0; r < R; ++r) {
      const int8_t* q = xq[r] + b * kQK;
      // Start from -128 * sum(q): sum (w+128) q - 128 sum q = sum w q exactly.
      __m512i s0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(xc[r][b]), w[0], bcast32(q + 0));
      __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast32(q + 4));
      for (int g = 2; g < 8; g += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[g], bcast32(q + 4 * g));
        s1 = _mm512_dpbusd_epi32(s1, w[g + 1], bcast32(q + 4 * g + 4));
      }
      const __m512 sumf = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      acc[r] = _mm512_fmadd_ps(sumf, _mm512_mul_ps(dw, _mm512_set1_ps(xd[r][b])), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * y_stride, store_mask, acc[r]);
}

template <void (*F1)(const uint8_t*, size_t, const ActView&, size_t, float*, size_t, __mmask16),
          void (*F2)(const uint8_t*, size_t, const ActView&, size_t, float*, size_t, __mmask16),
          void (*F3)(const uint8_t*, size_t, const ActView&, size_t, float*, size_t, __mmask16),
          void (*F4)(const uint8_t*, size_t, const ActView&, size_t, float*, size_t, __mmask16),
          void (*F8)(const uint8_t*, size_t, const ActView&, size_t, float*, size_t, __mmask16)>
void run_rows(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
              unsigned o_lo, unsigned o_hi) {
  const auto mask = static_cast<__mmask16>(((1u << o_hi) - 1) & ~((1u << o_lo) - 1));
  size_t r = 0;
  for (; r + 8 <= nr; r += 8) F8(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  // Tails: each lane's arithmetic is the same whatever the group size.
  for (; r + 4 <= nr; r += 4) F4(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  if (nr - r == 3) F3(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  else if (nr - r == 2) F2(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  else if (nr - r == 1) F1(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
}

void q4_1_tile_avx512(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
                      size_t y_stride, unsigned o_lo, unsigned o_hi) {
  run_rows<q4_1_rows<1>, q4_1_rows<2>, q4_1_rows<3>, q4_1_rows<4>, q4_1_rows<8>>(tile, nb, a, r0, nr, y, y_stride,
                                                                                 o_lo, o_hi);
}
void q8_0_tile_avx512(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
                      size_t y_stride, unsigned o_lo, unsigned o_hi) {
  run_rows<q8_0_rows<1>, q8_0_rows<2>, q8_0_rows<3>, q8_0_rows<4>, q8_0_rows<8>>(tile, nb, a, r0, nr, y, y_stride,
                                                                                 o_lo, o_hi);
}

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels k{quantize_q8_avx512, q4_1_tile_avx512, q8_0_tile_avx512};
  return k;
}

}  // namespace cf::kern

// AVX2 kernels over the same repacked tiles as AVX-512: a tile is processed as two halves
// of 8 rows (one ymm of 8 x 4 k-bytes), one float accumulator per 4-element group (the
// order of kernels_impl.h). Without VNNI the byte dot is maddubs + madd:
// Q4_1 nibbles are unsigned as is; Q8_0 uses |w| x sign(x, w) so that int16 pair sums
// cannot saturate. Integer sums and the per-lane float sequence equal the portable ones.
// GCC 12 reports its own _mm512_undefined_* helpers as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "model/kernels_impl.h"

namespace cf::kern {
namespace {

inline float fp16_round_f16c(float f) {
  return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline int hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

void quantize_q8_avx2(const float* x, size_t cols, uint8_t* out, bool q8_1) {
  const size_t nb = cols / kQK;
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* dv = reinterpret_cast<float*>(out + nb * kQK);
  float* sv = dv + nb;
  int32_t* cv = reinterpret_cast<int32_t*>(out + nb * kQK + nb * 4);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (size_t b = 0; b < nb; ++b) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + b * kQK + 8 * i);
    __m256 mx = _mm256_andnot_ps(sign, v[0]);
    for (int i = 1; i < 4; ++i) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
    const float amax = hmax8(mx);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 mul = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const int sum = hsum8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kQK), p);
    dv[b] = fp16_round_f16c(d);
    if (q8_1) {
      sv[b] = fp16_round_f16c(d * static_cast<float>(sum));
    } else {
      for (int g = 0; g < 8; ++g) {
        const int8_t* qg = qs + b * kQK + 4 * g;
        cv[8 * b + g] = -128 * (qg[0] + qg[1] + qg[2] + qg[3]);
      }
    }
  }
}

inline __m256i bcast32(const int8_t* p) { return _mm256_set1_epi32(load_i32(p)); }

inline __m256 hsum8_lanes(const __m256 l[8]) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
                       _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
}

// 8 rows (half h of the tile) x R activation rows; 8 per-group accumulators per row.
template <int R>
void q4_1_half(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, int h, float* out /*[R][8]*/) {
  __m256 acc[R][8];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < 8; ++g) acc[r][g] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = tile + b * kQ4_1TileBlock;
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 256 + 16 * h)));
    for (int r = 0; r < R; ++r) {
      const int8_t* q = a.qs(r0 + r) + b * kQK;
      const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(a.d(r0 + r)[b]));
      for (int g = 0; g < 4; ++g) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * g + 32 * h));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        const __m256i slo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, bcast32(q + 4 * g)), ones);
        const __m256i shi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, bcast32(q + 16 + 4 * g)), ones);
        acc[r][g] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(slo), acc[r][g]);
        acc[r][g + 4] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(shi), acc[r][g + 4]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* xs = a.s(r0 + r);
    __m256 summ = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      const __m256 mw = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + b * kQ4_1TileBlock + 288 + 16 * h)));
      summ = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs[b]), summ);
    }
    _mm256_storeu_ps(out + 8 * r, _mm256_add_ps(hsum8_lanes(acc[r]), summ));
  }
}

template <int R>
void q8_0_half(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, int h, float* out) {
  __m256 acc[R][8];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < 8; ++g) acc[r][g] = _mm256_setzero_ps();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = tile + b * kQ8_0TileBlock;
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 512 + 16 * h)));
    for (int r = 0; r < R; ++r) {
      const int8_t* q = a.qs(r0 + r) + b * kQK;
      const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(a.d(r0 + r)[b]));
      for (int g = 0; g < 8; ++g) {
        const __m256i ws = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * g + 32 * h)), flip);
        const __m256i sx = _mm256_sign_epi8(bcast32(q + 4 * g), ws);
        const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(ws), sx), ones);
        acc[r][g] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc[r][g]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + 8 * r, hsum8_lanes(acc[r]));
}

using HalfFn = void (*)(const uint8_t*, size_t, const ActView&, size_t, int, float*);

template <HalfFn F1, HalfFn F2>
void run_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
              unsigned o_lo, unsigned o_hi) {
  alignas(32) float buf[2 * 8];
  for (int h = 0; h < 2; ++h) {
    const unsigned lo = std::max(o_lo, 8u * h), hi = std::min(o_hi, 8u * h + 8);
    if (lo >= hi) continue;
    size_t r = 0;
    for (; r < nr; ) {
      const size_t g = nr - r >= 2 ? 2 : 1;
      if (g == 2) F2(tile, nb, a, r0 + r, h, buf);
      else F1(tile, nb, a, r0 + r, h, buf);
      for (size_t i = 0; i < g; ++i)
        for (unsigned o = lo; o < hi; ++o) y[(r + i) * y_stride + o] = buf[8 * i + o - 8 * h];
      r += g;
    }
  }
}

void q4_1_tile_avx2(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
                    size_t y_stride, unsigned o_lo, unsigned o_hi) {
  run_tile<q4_1_half<1>, q4_1_half<2>>(tile, nb, a, r0, nr, y, y_stride, o_lo, o_hi);
}
void q8_0_tile_avx2(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
                    size_t y_stride, unsigned o_lo, unsigned o_hi) {
  run_tile<q8_0_half<1>, q8_0_half<2>>(tile, nb, a, r0, nr, y, y_stride, o_lo, o_hi);
}

}  // namespace

const IsaKernels& avx2_kernels() {
  static const IsaKernels k{quantize_q8_avx2, q4_1_tile_avx2, q8_0_tile_avx2};
  return k;
}

}  // namespace cf::kern

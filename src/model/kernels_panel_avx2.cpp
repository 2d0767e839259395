// The panel GEMM on AVX2 (kernels_panel.h): one ymm is one 4-element group of 8 of the
// panel's 16 rows (each tile in two halves). Without VNNI a group's products are vpmaddubsw
// pairs (unsigned weight x signed activation, int16), and several groups' pairs add up in
// int16 before one vpmaddwd by ones widens them: exact while G groups x 2 x u_max x 127
// stays below 2^15, so 8 groups for 4-bit values, 4 for 5-bit, 2 for Q6_K's 6-bit. Q8_0's
// bytes (q + 128) would saturate a pair, so its kernel works on the signed q, one group at a
// time: |q| against the activation bytes carrying q's sign (the same integer sum, so it
// starts from 0, not from the record's -128 sum(q)). Up to 4 activation rows share each
// loaded group (2 for Q6_K's two sums per block: 16 ymm registers). Per lane the float steps
// are the portable kernel's.
#include <immintrin.h>

#include "model/kernels_panel.h"

namespace cf::kern {
namespace {

// Groups whose vpmaddubsw pairs may add up in int16 (above), per weight type.
constexpr int int16_groups(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q4_K: return 8;
    case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q5_K: return 4;
    case GgmlType::Q6_K: return 2;
    default: return 1;
  }
}

template <GgmlType T, int R>
inline void panel_rows(const uint8_t* panel, size_t nb, const ActView& a, size_t r0, int half, float out[][8]) {
  constexpr PanelType P = panel_type(T);
  constexpr bool kSigned = T == GgmlType::Q8_0;
  constexpr int G = int16_groups(T);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kPanelBlock;
    __m256i il[R], ih[R];  // elements 0..15 (groups 0..3) and 16..31 (Sub16; else all in il)
    for (int r = 0; r < R; ++r) {
      const bool start = P.kind == PanelKind::Sub16 || (P.kind == PanelKind::Offset && !kSigned);
      il[r] = start ? _mm256_set1_epi32(panel_corr(a, r0 + r)[b]) : _mm256_setzero_si256();
      if constexpr (P.kind == PanelKind::Sub16) ih[r] = _mm256_set1_epi32(panel_corr_hi(a, r0 + r)[b]);
    }
    for (int g0 = 0; g0 < 8; g0 += G) {
      __m256i s16[R];
      for (int g = g0; g < g0 + G; ++g) {
        __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb + 64 * g + 32 * half));
        __m256i wsigned = _mm256_setzero_si256();
        if constexpr (kSigned) {
          wsigned = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
          w = _mm256_abs_epi8(wsigned);
        }
        for (int r = 0; r < R; ++r) {
          __m256i x = _mm256_set1_epi32(load_i32(a.qs(r0 + r) + b * kQK + 4 * g));
          if constexpr (kSigned) x = _mm256_sign_epi8(x, wsigned);
          const __m256i p = _mm256_maddubs_epi16(w, x);
          s16[r] = g == g0 ? p : _mm256_add_epi16(s16[r], p);
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_madd_epi16(s16[r], ones);
        if (P.kind == PanelKind::Sub16 && g0 >= 4) ih[r] = _mm256_add_epi32(ih[r], p);
        else il[r] = _mm256_add_epi32(il[r], p);
      }
    }
    const __m256 scale = _mm256_load_ps(reinterpret_cast<const float*>(pb + kPanelScale) + 8 * half);
    const __m256 second = _mm256_load_ps(reinterpret_cast<const float*>(pb + kPanelSecond) + 8 * half);
    for (int r = 0; r < R; ++r) {
      const __m256 vdx = _mm256_set1_ps(panel_dx(a, r0 + r)[b]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(il[r]), _mm256_mul_ps(scale, vdx), acc[r]);
      if constexpr (P.kind == PanelKind::Sub16)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ih[r]), _mm256_mul_ps(second, vdx), acc[r]);
      if constexpr (P.kind == PanelKind::Min)
        acc[r] = _mm256_fmadd_ps(second, _mm256_set1_ps(panel_s(a, r0 + r)[b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

template <GgmlType T>
void panel_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
                unsigned o_lo, unsigned o_hi) {
  uint8_t* panel = panel_scratch(nb);
  panel_unpack_tile(T, tile, nb, panel, [](const uint8_t* src, float* dst) {
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(dst + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * h))));
  });
  float out[4][8];
  for (int half = 0; half < 2; ++half) {
    const unsigned lo = std::max(o_lo, 8u * half), hi = std::min(o_hi, 8u * half + 8);
    if (lo >= hi) continue;
    constexpr int kMaxRows = panel_type(T).kind == PanelKind::Sub16 ? 2 : 4;
    for (size_t r = 0; r < nr;) {
      const size_t left = nr - r;
      const int R = left >= kMaxRows ? kMaxRows : left >= 2 ? 2 : 1;
      if (R == 4) panel_rows<T, (kMaxRows < 4 ? kMaxRows : 4)>(panel, nb, a, r0 + r, half, out);
      else if (R == 2) panel_rows<T, 2>(panel, nb, a, r0 + r, half, out);
      else panel_rows<T, 1>(panel, nb, a, r0 + r, half, out);
      for (int i = 0; i < R; ++i)
        for (unsigned o = lo; o < hi; ++o) y[(r + i) * y_stride + o] = out[i][o - 8 * half];
      r += R;
    }
  }
}

TileKernelFn avx2_tile(GgmlType t) {
  return panel_kernel_for(t, []<GgmlType T>() { return &panel_tile<T>; });
}

}  // namespace

const PanelKernels& panel_kernels_avx2() {
  static const PanelKernels k{row_major_quantize, avx2_tile};
  return k;
}

}  // namespace cf::kern

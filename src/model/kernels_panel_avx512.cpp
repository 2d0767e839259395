// The panel GEMM on AVX-512 VNNI (kernels_panel.h): one zmm is one 4-element group of the
// panel's 16 rows; vpdpbusd takes the group against 4 activation bytes broadcast from
// memory, and the 8 groups of a block go into one int32 accumulator per activation row.
// Up to 8 activation rows share each loaded block (8 weight, 8 float accumulator and a few
// scale registers of the 32); an offset type's sum starts at the record's correction. Per lane the float steps are the portable kernel's.
// GCC 12 reports its own _mm512_undefined_* helpers as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "model/kernels_panel.h"

namespace cf::kern {
namespace {

// acc + vpdpbusd(w, the 4 activation bytes at p in every lane), the broadcast folded into
// the instruction's memory operand (GCC would emit a vpbroadcastd per _mm512_set1_epi32).
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

template <GgmlType T, int R>
inline void panel_rows(const uint8_t* panel, size_t nb, const ActView& a, size_t r0, float* y, size_t y_stride,
                       __mmask16 mask) {
  constexpr PanelType P = panel_type(T);
  __m512 acc[R];
  const int8_t* xq[R];
  const float *dx[R], *s[R];
  const int32_t *corr[R], *corr_hi[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    xq[r] = a.qs(r0 + r);
    dx[r] = panel_dx(a, r0 + r);
    s[r] = panel_s(a, r0 + r);
    corr[r] = panel_corr(a, r0 + r);
    corr_hi[r] = panel_corr_hi(a, r0 + r);
  }
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kPanelBlock;
    __m512i w[8];
    for (int g = 0; g < 8; ++g) w[g] = _mm512_load_si512(pb + 64 * g);
    const __m512 scale = _mm512_load_ps(pb + kPanelScale), second = _mm512_load_ps(pb + kPanelSecond);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = xq[r] + b * kQK;
      const __m512 vdx = _mm512_set1_ps(dx[r][b]);
      if constexpr (P.kind == PanelKind::Sub16) {
        __m512i il = _mm512_set1_epi32(corr[r][b]), ih = _mm512_set1_epi32(corr_hi[r][b]);
        for (int g = 0; g < 4; ++g) {
          il = dpbusd_bcast(il, w[g], q + 4 * g);
          ih = dpbusd_bcast(ih, w[g + 4], q + 16 + 4 * g);
        }
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(il), _mm512_mul_ps(scale, vdx), acc[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ih), _mm512_mul_ps(second, vdx), acc[r]);
      } else {
        __m512i i = P.kind == PanelKind::Offset ? _mm512_set1_epi32(corr[r][b]) : _mm512_setzero_si512();
        __m512i i2 = _mm512_setzero_si512();  // two chains of 4: half the latency of one of 8
        for (int g = 0; g < 4; ++g) {
          i = dpbusd_bcast(i, w[g], q + 4 * g);
          i2 = dpbusd_bcast(i2, w[g + 4], q + 16 + 4 * g);
        }
        i = _mm512_add_epi32(i, i2);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(scale, vdx), acc[r]);
        if constexpr (P.kind == PanelKind::Min) acc[r] = _mm512_fmadd_ps(second, _mm512_set1_ps(s[r][b]), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * y_stride, mask, acc[r]);
}

template <GgmlType T>
void panel_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
                unsigned o_lo, unsigned o_hi) {
  uint8_t* panel = panel_scratch(nb);
  panel_unpack_tile(T, tile, nb, panel, [](const uint8_t* src, float* dst) {
    _mm512_storeu_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
  });
  const auto mask = static_cast<__mmask16>(((1u << o_hi) - 1) & ~((1u << o_lo) - 1));
  size_t r = 0;
  for (; r + 8 <= nr; r += 8) panel_rows<T, 8>(panel, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  if (r + 4 <= nr) {
    panel_rows<T, 4>(panel, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
    r += 4;
  }
  if (r + 2 <= nr) {
    panel_rows<T, 2>(panel, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
    r += 2;
  }
  if (r < nr) panel_rows<T, 1>(panel, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
}

// panel_quantize_row in 16 lanes (its scalar max was 5% of a 2048-token prefill). Same bits:
// max is exact in any order and vmaxps(v, m) is the scalar's v > m ? v : m (a NaN is
// skipped); the product is rounded before the rounding to an integer, as there.
void avx512_quantize(const float* x, size_t cols, uint8_t* records, size_t r, size_t stride, PanelType type) {
  const size_t nb = cols / kQK;
  uint8_t* out = records + r * stride;
  const PanelRecordFields rec(out, nb);
  const __m512 sign_off = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (size_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * kQK), x1 = _mm512_loadu_ps(x + b * kQK + 16);
    __m512 m = _mm512_max_ps(_mm512_and_ps(x0, sign_off), _mm512_setzero_ps());
    m = _mm512_max_ps(_mm512_and_ps(x1, sign_off), m);
    const float amax = _mm512_reduce_max_ps(m);
    const __m512 id = _mm512_set1_ps(panel_quant_factor(amax));
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x0, id), kRound);
    const __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x1, id), kRound);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + b * kQK), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + b * kQK + 16), _mm512_cvtepi32_epi8(q1));
    rec.set(b, amax, _mm512_reduce_add_epi32(q0), _mm512_reduce_add_epi32(q1), type);
  }
}

TileKernelFn avx512_tile(GgmlType t) {
  return panel_kernel_for(t, []<GgmlType T>() { return &panel_tile<T>; });
}

}  // namespace

const PanelKernels& panel_kernels_avx512() {
  static const PanelKernels k{avx512_quantize, avx512_tile};
  return k;
}

}  // namespace cf::kern

// The panel GEMM on AVX2 (kernels_panel.h): one ymm is one 4-element group of 8 of the
// panel's 16 rows (each tile in two halves). Without VNNI a group's products are vpmaddubsw
// pairs (unsigned weight x signed activation, int16), and several groups' pairs add up in
// int16 before one vpmaddwd by ones widens them: exact while G groups x 2 x u_max x 127
// stays below 2^15, so 8 groups for 4-bit values, 4 for 5-bit, 2 for Q6_K's 6-bit. Q8_0's
// bytes (q + 128) would saturate a pair, so its kernel works on the signed q, one group at a
// time: |q| against the activation bytes carrying q's sign (the same integer sum, so it
// starts from 0, not from the record's -128 sum(q)). Each broadcast activation group feeds
// both halves of the tile, so a tile reads every activation byte once. Per lane the float
// steps are the portable kernel's.
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

// Activation rows per call. One row already keeps 2 weight loads busy per 4 vpmaddubsw
// (both halves); a second row's accumulators spill on 16 ymm registers, which cost more than
// the loads they save, except for Q6_K (2 groups per int16 sum, short live ranges). Measured
// on Zen 3 (bench_gemm, 1 thread, 5 alternated runs): against the earlier kernel (up to 4
// rows on one half at a time) Q5_0 +24%, Q4_1 +29%, Q4_K +12%, Q6_K +11-21%, Q8_0 -6% (noise).
template <GgmlType T>
constexpr int kAvx2Rows = T == GgmlType::Q6_K ? 2 : 1;

// The whole tile (16 rows = two ymm halves) against R activation rows.
template <GgmlType T, int R>
inline void panel_rows(const uint8_t* panel, size_t nb, const ActView& a, size_t r0, float out[][kTileRows]) {
  constexpr PanelType P = panel_type(T);
  constexpr bool kSigned = T == GgmlType::Q8_0;
  constexpr int G = int16_groups(T);
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* qs[R];
  const float* dx[R];
  for (int r = 0; r < R; ++r) qs[r] = a.qs(r0 + r), dx[r] = panel_dx(a, r0 + r);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kPanelBlock;
    // il: elements 0..15 (groups 0..3), and for Sub16 only; otherwise the whole block.
    __m256i il[R][2];
    for (int r = 0; r < R; ++r) {
      const bool start = P.kind == PanelKind::Sub16 || (P.kind == PanelKind::Offset && !kSigned);
      il[r][0] = il[r][1] = start ? _mm256_set1_epi32(panel_corr(a, r0 + r)[b]) : _mm256_setzero_si256();
    }
    const __m256 scale[2] = {_mm256_load_ps(panel_scale(pb)), _mm256_load_ps(panel_scale(pb) + 8)};
    for (int g0 = 0; g0 < 8; g0 += G) {
      if (P.kind == PanelKind::Sub16 && g0 == 4) {  // elements 0..15 done: their float step now, the
        for (int r = 0; r < R; ++r) {               // same order as summing both halves first
          const __m256 vdx = _mm256_set1_ps(dx[r][b]);
          for (int h = 0; h < 2; ++h) {
            acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(il[r][h]), _mm256_mul_ps(scale[h], vdx), acc[r][h]);
            il[r][h] = _mm256_set1_epi32(panel_corr_hi(a, r0 + r)[b]);
          }
        }
      }
      __m256i s16[R][2];
      for (int g = g0; g < g0 + G; ++g) {
        __m256i w[2], wsigned[2];
        for (int h = 0; h < 2; ++h) {
          w[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb + 64 * g + 32 * h));
          if constexpr (kSigned) {
            wsigned[h] = _mm256_xor_si256(w[h], _mm256_set1_epi8(static_cast<char>(0x80)));
            w[h] = _mm256_abs_epi8(wsigned[h]);
          }
        }
        for (int r = 0; r < R; ++r) {
          const __m256i x = _mm256_set1_epi32(load_i32(qs[r] + b * kQK + 4 * g));
          for (int h = 0; h < 2; ++h) {
            const __m256i p = _mm256_maddubs_epi16(w[h], kSigned ? _mm256_sign_epi8(x, wsigned[h]) : x);
            s16[r][h] = g == g0 ? p : _mm256_add_epi16(s16[r][h], p);
          }
        }
      }
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) il[r][h] = _mm256_add_epi32(il[r][h], _mm256_madd_epi16(s16[r][h], ones));
    }
    const __m256 second[2] = {_mm256_load_ps(panel_second(pb)), _mm256_load_ps(panel_second(pb) + 8)};
    for (int r = 0; r < R; ++r) {
      const __m256 vdx = _mm256_set1_ps(dx[r][b]);
      for (int h = 0; h < 2; ++h) {
        const __m256 f = P.kind == PanelKind::Sub16 ? second[h] : scale[h];
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(il[r][h]), _mm256_mul_ps(f, vdx), acc[r][h]);
        if constexpr (P.kind == PanelKind::Min)
          acc[r][h] = _mm256_fmadd_ps(second[h], _mm256_set1_ps(panel_s(a, r0 + r)[b]), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out[r] + 8 * h, acc[r][h]);
}

template <GgmlType T>
void panel_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
                unsigned o_lo, unsigned o_hi) {
  uint8_t* panel = panel_scratch(nb);
  panel_unpack_tile(T, tile, nb, panel, [](const uint8_t* src, float* dst) {
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(dst + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * h))));
  });
  // Rows per call: as many as 16 ymm registers hold without spilling (measured).
  constexpr int kMaxRows = kAvx2Rows<T>;
  float out[kMaxRows][kTileRows];
  for (size_t r = 0; r < nr;) {
    const size_t left = nr - r;
    const int R = left >= kMaxRows ? kMaxRows : 1;
    if (R == kMaxRows) panel_rows<T, kMaxRows>(panel, nb, a, r0 + r, out);
    else panel_rows<T, 1>(panel, nb, a, r0 + r, out);
    for (int i = 0; i < R; ++i)
      for (unsigned o = o_lo; o < o_hi; ++o) y[(r + i) * y_stride + o] = out[i][o];
    r += R;
  }
}

// panel_quantize_row in 8 lanes, with the same bits (see avx512_quantize).
inline int32_t sum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

void avx2_quantize(const float* x, size_t cols, uint8_t* records, size_t r, size_t stride, PanelType type) {
  const size_t nb = cols / kQK;
  uint8_t* out = records + r * stride;
  const PanelRecordFields rec(out, nb);
  const __m256 sign_off = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (size_t b = 0; b < nb; ++b) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(x + b * kQK + 8 * j);
      m = _mm256_max_ps(_mm256_and_ps(v[j], sign_off), m);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const __m256 id = _mm256_set1_ps(panel_quant_factor(amax));
    __m256i q[4];
    for (int j = 0; j < 4; ++j)
      q[j] = _mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // int32 -> int8 (all within +-127): the packs work per 128-bit lane, the permute restores order.
    const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + b * kQK),
                        _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    rec.set(b, amax, sum8(_mm256_add_epi32(q[0], q[1])), sum8(_mm256_add_epi32(q[2], q[3])), type);
  }
}

TileKernelFn avx2_tile(GgmlType t) {
  return panel_kernel_for(t, []<GgmlType T>() { return &panel_tile<T>; });
}

}  // namespace

const PanelKernels& panel_kernels_avx2() {
  static const PanelKernels k{avx2_quantize, avx2_tile};
  return k;
}

}  // namespace cf::kern

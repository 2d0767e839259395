// The runtime kernels on AVX2 (CMake adds -mavx2 -mfma -mf16c by file name): ScalarOps'
// hooks with AVX2 intrinsics where GCC's code for the scalar form was slow, each the same
// float operations in the same order as the scalar form it replaces (ymm registers holding
// 8 of its lanes), so the bits are the portable kernels'. Batched attention takes
// attention_flash_avx2.cpp first.
#include <immintrin.h>

#include "runtime/exp_simd.h"
#include "runtime/f16c_rows.h"
#include "runtime/runtime_kernels_table.h"

namespace cf::rk {
namespace {

// round_f16 on 8 lanes, the same integer and float steps.
inline __m256 round_f16_8(__m256 x) {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i r = _mm256_and_si256(
      _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x0fff)), _mm256_and_si256(_mm256_srli_epi32(b, 13), _mm256_set1_epi32(1))),
      _mm256_set1_epi32(static_cast<int>(0xffffe000u)));
  const __m256 sub = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(16777216.0f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                   _mm256_set1_ps(1.0f / 16777216.0f));
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x38800000), a);  // a < 2^-14 (a is non-negative)
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), sub, _mm256_castsi256_ps(is_sub));
}

// dot_single for HD % 64 == 0 (no double tail), up to its reduce16: the 64 lanes as 8
// registers (lane 8c + i in register c), folded to f[0..7] + f[8..15] = reduce16's first step.
template <int HD>
inline __m256 single_dot_g(const float* q, const uint16_t* k) {
  __m256 l[8];
  for (int c = 0; c < 8; ++c) l[c] = _mm256_setzero_ps();
  for (int i = 0; i < HD; i += 64)
    for (int c = 0; c < 8; ++c)
      l[c] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8 * c),
                             _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i + 8 * c))), l[c]);
  const __m256 f_lo = _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6]));
  const __m256 f_hi = _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7]));
  return _mm256_add_ps(f_lo, f_hi);
}
// The rest of reduce16 for 8 entries at once (g[e]: single_dot_g's): lane e of the result
// is ((a0 + a2) + (a1 + a3)) with a_i = g[e][i] + g[e][i + 4].
inline __m256 reduce_g8(const __m256 g[8]) {
  __m256 a[4];  // [a of entry 2i | a of entry 2i + 1]
  for (int i = 0; i < 4; ++i)
    a[i] = _mm256_add_ps(_mm256_permute2f128_ps(g[2 * i], g[2 * i + 1], 0x20), _mm256_permute2f128_ps(g[2 * i], g[2 * i + 1], 0x31));
  // (a0 + a2, a1 + a3) of entries (0, 2 | 1, 3) and (4, 6 | 5, 7).
  const __m256 b0 = _mm256_add_ps(_mm256_shuffle_ps(a[0], a[1], 0x44), _mm256_shuffle_ps(a[0], a[1], 0xEE));
  const __m256 b1 = _mm256_add_ps(_mm256_shuffle_ps(a[2], a[3], 0x44), _mm256_shuffle_ps(a[2], a[3], 0xEE));
  // entries (0, 2, 4, 6 | 1, 3, 5, 7)
  const __m256 c = _mm256_add_ps(_mm256_shuffle_ps(b0, b1, 0x88), _mm256_shuffle_ps(b0, b1, 0xDD));
  return _mm256_permutevar8x32_ps(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

struct Avx2Ops : ScalarOps<Avx2Ops> {
  static size_t f16_to_f32_prefix(const uint16_t* x, float* y, size_t n) { return f16c_to_f32_prefix(x, y, n); }
  static size_t f32_to_f16_prefix(const float* x, uint16_t* y, size_t n) { return f32_to_f16c_prefix(x, y, n); }
  static size_t silu_mul_prefix(float* gate, const float* up, size_t n) {
    size_t i0 = 0;
    for (; i0 + 8 <= n; i0 += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i0);
      const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
      _mm256_storeu_ps(gate + i0, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), _mm256_loadu_ps(up + i0)));
    }
    return i0;
  }

  static bool batched_tile(const TileArgs& a, std::vector<float>& scratch) { return attend_tile_flash_avx2(a, scratch); }

  template <int HD>
  static bool direct_scores(const ScoreBlock& blk) {
    if constexpr (HD > 0 && HD % 64 == 0) {
      if (blk.single) {
        const float* qs = blk.qs;
        const int32_t* qpos = blk.qpos;
        const int32_t* qlow = blk.qlow;
        const int32_t* epos = blk.epos;
        const uint16_t* kb = blk.kb;
        const size_t kv_stride = blk.kv_stride, bn = blk.bn, padded = blk.padded, b0 = blk.b0;
        const float scale = blk.scale;
        // dot_single for 8 entries at a time, its reduce16 as shuffles across them (the
        // scalar tree, per entry, took most of a decode step's attention).
        for (size_t qi = 0; qi < blk.nq; ++qi) {
          float* __restrict s = &blk.scores[qi * padded + b0];
          const float* qv = qs + qi * HD;
          for (size_t j0 = 0; j0 < kBlock; j0 += 8) {
            __m256 g[8];
            for (size_t u = 0; u < 8; ++u)
              g[u] = j0 + u < bn ? single_dot_g<HD>(qv, kb + (j0 + u) * kv_stride) : _mm256_setzero_ps();
            const __m256i ep = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(epos + j0));
            // visible: qlow < ep <= qpos (epos past bn: never visible)
            const __m256i hidden = _mm256_or_si256(_mm256_cmpgt_epi32(ep, _mm256_set1_epi32(qpos[qi])),
                                                   _mm256_cmpgt_epi32(_mm256_set1_epi32(qlow[qi]), ep));
            const __m256i at_low = _mm256_cmpeq_epi32(ep, _mm256_set1_epi32(qlow[qi]));
            const __m256 mask = _mm256_castsi256_ps(_mm256_or_si256(hidden, at_low));
            _mm256_storeu_ps(s + j0, _mm256_blendv_ps(_mm256_mul_ps(reduce_g8(g), _mm256_set1_ps(scale)),
                                                      _mm256_set1_ps(kNegInf), mask));
          }
        }
        return true;
      }
    }
    return false;
  }

  static bool transposed_scores(const ScoreBlock& blk, size_t qi, const float* kt, int hd) {
    if (blk.single || hd % 16 != 0) return false;
    const float* __restrict qv = blk.qs + qi * hd;
    const int32_t* epos = blk.epos;
    const int32_t* qpos = blk.qpos;
    const int32_t* qlow = blk.qlow;
    const float scale = blk.scale;
    // The same 16 lanes (lane t: the fma chain over d = t mod 16) for 8 entries at a
    // time: lanes 8..15 first, then lanes 0..7, 8 registers each, then reduce16 as
    // vertical adds (its first step adds lane t + 8 to lane t).
    float* __restrict s = &blk.scores[qi * blk.padded + blk.b0];
    for (size_t j0 = 0; j0 < kBlock; j0 += 8) {
      __m256 hi[8], acc[8];
      for (int t = 0; t < 8; ++t) hi[t] = acc[t] = _mm256_setzero_ps();
      for (int c = 0; c < hd; c += 16)
        for (int t = 0; t < 8; ++t)
          hi[t] = _mm256_fmadd_ps(_mm256_set1_ps(qv[c + 8 + t]), _mm256_load_ps(kt + (c + 8 + t) * kBlock + j0), hi[t]);
      for (int c = 0; c < hd; c += 16)
        for (int t = 0; t < 8; ++t)
          acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(qv[c + t]), _mm256_load_ps(kt + (c + t) * kBlock + j0), acc[t]);
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_add_ps(acc[i], hi[i]);
      for (int step = 4; step >= 1; step /= 2)
        for (int i = 0; i < step; ++i) acc[i] = _mm256_add_ps(acc[i], acc[i + step]);
      const __m256i ep = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(epos + j0));
      const __m256i hidden = _mm256_or_si256(_mm256_cmpgt_epi32(ep, _mm256_set1_epi32(qpos[qi])),
                                             _mm256_cmpgt_epi32(_mm256_set1_epi32(qlow[qi]), ep));
      // visible: ep <= qpos and ep > qlow; qlow == ep is hidden too.
      const __m256i at_low = _mm256_cmpeq_epi32(ep, _mm256_set1_epi32(qlow[qi]));
      const __m256 mask = _mm256_castsi256_ps(_mm256_or_si256(hidden, at_low));
      _mm256_storeu_ps(s + j0, _mm256_blendv_ps(_mm256_mul_ps(acc[0], _mm256_set1_ps(scale)), _mm256_set1_ps(kNegInf), mask));
    }
    return true;
  }

  static void lane_max(const float* s, size_t n, float* mx_lanes) {
    // vmaxps(a, b) is a > b ? a : b, ScalarOps::lane_max's step
    __m256 m0 = _mm256_set1_ps(kNegInf), m1 = m0;
    for (size_t e = 0; e < n; e += 16) {
      m0 = _mm256_max_ps(m0, _mm256_loadu_ps(s + e));
      m1 = _mm256_max_ps(m1, _mm256_loadu_ps(s + e + 8));
    }
    _mm256_store_ps(mx_lanes, m0);
    _mm256_store_ps(mx_lanes + 8, m1);
  }
  static size_t exp_prefix(float* s, size_t n, float mx) {
    size_t e0 = 0;
    for (; e0 + 8 <= n; e0 += 8) {
      const __m256 v = _mm256_loadu_ps(s + e0);
      const __m256 ex = exp8(_mm256_sub_ps(v, _mm256_set1_ps(mx)));
      _mm256_storeu_ps(s + e0, _mm256_blendv_ps(ex, _mm256_setzero_ps(), _mm256_cmp_ps(v, _mm256_set1_ps(kNegInf), _CMP_EQ_OQ)));
    }
    return e0;
  }
  static double sum_of_reduce16(const float* s, size_t n) {
    double sum = 0;
    for (size_t e = 0; e < n; e += 16) {  // reduce16's tree: (l + l+8), then + l+4, + l+2, + l+1
      const __m256 u = _mm256_add_ps(_mm256_loadu_ps(s + e), _mm256_loadu_ps(s + e + 8));
      const __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
      const __m128 t = _mm_add_ps(v, _mm_movehl_ps(v, v));
      sum += static_cast<double>(_mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t))));
    }
    return sum;
  }
  static size_t normalize_prefix(float* s, size_t n, float inv) {
    size_t r0 = 0;
    for (; r0 + 8 <= n; r0 += 8) _mm256_storeu_ps(s + r0, round_f16_8(_mm256_mul_ps(_mm256_loadu_ps(s + r0), _mm256_set1_ps(inv))));
    return r0;
  }

  template <int HD>
  static bool single_lane_pv(const float* __restrict p, const uint16_t* vh, size_t kv_stride, size_t n_entries,
                             size_t t, size_t lanes, float* __restrict acc) {
    if constexpr (HD > 0 && HD % 64 == 0) {
      // As ScalarOps' loop, 64 dimensions at a time in 8 registers (o spilled to the stack).
      for (int d0 = 0; d0 < HD; d0 += 64) {
        __m256 o[8];
        for (int k = 0; k < 8; ++k) o[k] = _mm256_setzero_ps();
        for (size_t e = t; e < n_entries; e += lanes) {
          const float pe = p[e];
          if (pe == 0.f) continue;  // adds an exact zero
          const __m256 p8 = _mm256_set1_ps(pe);
          const uint16_t* __restrict vr = vh + e * kv_stride + d0;
          for (int k = 0; k < 8; ++k)
            o[k] = _mm256_fmadd_ps(p8, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + 8 * k))), o[k]);
        }
        for (int k = 0; k < 8; ++k) _mm256_storeu_ps(acc + d0 + 8 * k, o[k]);
      }
      return true;
    }
    return false;
  }

  static constexpr bool kConvertsVBlock = true;
  template <int HD>
  static size_t block_pv(const PvBlock& blk, size_t qi, const float* __restrict p, float* q_lanes) {
    if constexpr (HD > 0 && HD % 64 == 0 && HD <= 256) {
      float* vt = blk.vt;
      const uint16_t* vb = blk.vb;
      const size_t kv_stride = blk.kv_stride, bn = blk.bn, padded = blk.padded, lanes = blk.lanes, nq = blk.nq;
      const int hd = blk.hd;
      // The block's V rows converted once (vt), lane t's accumulator 64 dimensions (8
      // registers) at a time.
      if (qi == 0)
        for (size_t j = 0; j < bn; ++j)
          for (int k = 0; k < HD / 8; ++k)
            _mm256_store_ps(vt + j * HD + 8 * k,
                            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vb + j * kv_stride + 8 * k))));
      // Heads of 128+: two queries per V load, 32 dimensions (4 registers) of each at a time
      // (Gemma 3, 2048-token prefill at 1 thread: attention / Q5_0 kernel samples 1.25 ->
      // 1.06). Not for 64: one 64-wide pass per query was faster there (0.43 -> 0.49).
      if (HD >= 128 && qi + 1 < nq) {
        const float* __restrict p2 = p + padded;
        float* q_lanes2 = q_lanes + lanes * hd;
        for (size_t t = 0; t < 16 && t < bn; ++t)
          for (int d0 = 0; d0 < HD; d0 += 32) {
            float* __restrict acc = q_lanes + t * HD + d0;
            float* __restrict acc2 = q_lanes2 + t * HD + d0;
            __m256 o[4], o2[4];
            for (int k = 0; k < 4; ++k) {
              o[k] = _mm256_loadu_ps(acc + 8 * k);
              o2[k] = _mm256_loadu_ps(acc2 + 8 * k);
            }
            for (size_t j = t; j < bn; j += 16) {
              const __m256 pj = _mm256_set1_ps(p[j]), pj2 = _mm256_set1_ps(p2[j]);
              for (int k = 0; k < 4; ++k) {
                const __m256 v = _mm256_load_ps(vt + j * HD + d0 + 8 * k);
                o[k] = _mm256_fmadd_ps(pj, v, o[k]);
                o2[k] = _mm256_fmadd_ps(pj2, v, o2[k]);
              }
            }
            for (int k = 0; k < 4; ++k) {
              _mm256_storeu_ps(acc + 8 * k, o[k]);
              _mm256_storeu_ps(acc2 + 8 * k, o2[k]);
            }
          }
        return 2;
      }
      for (size_t t = 0; t < 16 && t < bn; ++t) {
        float* __restrict acc = q_lanes + t * HD;
        for (int d0 = 0; d0 < HD; d0 += 64) {
          __m256 o[8];
          for (int k = 0; k < 8; ++k) o[k] = _mm256_loadu_ps(acc + d0 + 8 * k);
          for (size_t j = t; j < bn; j += 16) {
            const __m256 pj = _mm256_set1_ps(p[j]);
            for (int k = 0; k < 8; ++k) o[k] = _mm256_fmadd_ps(pj, _mm256_load_ps(vt + j * HD + d0 + 8 * k), o[k]);
          }
          for (int k = 0; k < 8; ++k) _mm256_storeu_ps(acc + d0 + 8 * k, o[k]);
        }
      }
      return 1;
    }
    return 0;
  }
};

}  // namespace

const RuntimeKernels& runtime_kernels_avx2() { return runtime_kernels_table<Avx2Ops>(); }

}  // namespace cf::rk

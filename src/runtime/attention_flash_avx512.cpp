// Batched attention on AVX-512 (prefill and recomputed rows: TileArgs::single_row_order
// false), in an order of our own, held to the numerics contract by tolerance
// (docs/ARCHITECTURE.md, "Numerics contract"; tests/runtime/test_attention_order.cpp,
// AttentionContract.*), not to llama.cpp's bits as the other ISAs' kernels are.
//
// One pass over the cache in blocks of 64 entries with an online softmax (FlashAttention's
// recurrence: per query a running maximum m, sum l and output o; a block with a higher
// maximum rescales l and o by exp(m_old - m_new)), where the llama.cpp order needs all
// scores first, then the softmax, then P.V in 16 lanes per output. Per block the entries'
// K are converted to float once (transposed, [d][entry]) and V once ([entry][d]) and shared
// by every query of the task (its rows x the KV head's query heads); the score and P.V loops
// are register-blocked over queries (4 queries x 64 entries; 16 / (hd / 16) queries x hd)
// so that one loaded vector feeds several fmas. Everything stays in float: Q rounded to f16
// (as llama.cpp's Q.K input is) and scaled, P not rounded to f16 (llama.cpp rounds it), so
// the result is closer to the exact attention than llama.cpp's (the tests measure it).
//
// A query's result depends only on its own q, position and the cache: not on the other rows
// of its task (blocks no query of the task sees are skipped, and a block a query does not
// see leaves its m, l and o exactly as they were), so a row gives the same bits in any batch.
// GCC 12 reports its own _mm512_undefined_* helpers as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "runtime/runtime_kernels.h"

namespace cf::rk {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kScoreQueries = 4;  // queries per score step: 4 x 4 accumulators of 16 entries

// exp on 16 lanes: ggml's expf polynomial (runtime_kernels_impl.inc's exp_inline), the edges
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

inline float f16_round(float x) { return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); }

// NC = head_dim / 16 vectors per row.
template <int NC>
void flash_tile(const TileArgs& a, std::vector<float>& scratch) {
  constexpr int hd = 16 * NC;
  // P.V: kOutQueries x NC accumulators (at most 16), a divisor of kScoreQueries.
  constexpr int kOutQueries = NC <= 4 ? 4 : NC <= 8 ? 2 : 1;
  const AttentionShape& s = *a.s;
  const int group = s.n_heads / s.n_kv_heads;
  const size_t q_stride = static_cast<size_t>(s.n_heads) * hd;
  const size_t kv_stride = static_cast<size_t>(s.n_kv_heads) * hd;
  const size_t n_rows = a.row_end - a.row_begin;
  const size_t nq = n_rows * static_cast<size_t>(group);
  const size_t nq_pad = (nq + kScoreQueries - 1) / kScoreQueries * kScoreQueries;
  const float scale = s.score_scale(), q_pre = s.q_prescale();

  // scratch: kt [hd][64] | vt [64][hd] | q [nq_pad][hd] | o [nq_pad][hd] | p [4][64] | m, l,
  // qpos, qlow [nq_pad]
  scratch.resize(2 * hd * kBlock + 2 * nq_pad * hd + kScoreQueries * kBlock + 4 * nq_pad + 16);
  float* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  float* kt = base;
  float* vt = kt + hd * kBlock;
  float* qs = vt + hd * kBlock;
  float* o = qs + nq_pad * hd;
  float* p = o + nq_pad * hd;
  float* m = p + kScoreQueries * kBlock;
  float* l = m + nq_pad;
  auto* qpos = reinterpret_cast<int32_t*>(l + nq_pad);
  int32_t* qlow = qpos + nq_pad;

  int32_t max_pos = std::numeric_limits<int32_t>::min(), min_low = std::numeric_limits<int32_t>::max();
  for (size_t qi = 0; qi < nq_pad; ++qi) {
    float* dst = qs + qi * hd;
    if (qi >= nq) {  // padding queries: see nothing, their results are dropped
      std::fill_n(dst, hd, 0.f);
      qpos[qi] = std::numeric_limits<int32_t>::min();
      qlow[qi] = std::numeric_limits<int32_t>::max();
    } else {
      const size_t r = qi / group, j = qi % group;
      const float* src = a.q + (a.row_begin + r) * q_stride + (static_cast<size_t>(a.kv_head) * group + j) * hd;
      for (int d = 0; d < hd; ++d) dst[d] = f16_round(src[d] * q_pre) * scale;
      qpos[qi] = a.row_pos[a.row_begin + r];
      qlow[qi] = s.window > 0 ? qpos[qi] - s.window : std::numeric_limits<int32_t>::min();
      max_pos = std::max(max_pos, qpos[qi]);
      min_low = std::min(min_low, qlow[qi]);
    }
    std::fill_n(o + qi * hd, hd, 0.f);
    m[qi] = kNegInf;
    l[qi] = 0.f;
  }

  const size_t n_blocks = (a.n_entries + kBlock - 1) / kBlock;
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t b0 = b * kBlock, bn = std::min(kBlock, a.n_entries - b0);
    alignas(64) int32_t epos[kBlock];
    int32_t blk_min = std::numeric_limits<int32_t>::max(), blk_max = std::numeric_limits<int32_t>::min();
    for (size_t e = 0; e < kBlock; ++e) {
      epos[e] = e < bn ? a.entry_pos[b0 + e] : std::numeric_limits<int32_t>::max();  // padding: never visible
      if (e < bn) {
        blk_min = std::min(blk_min, epos[e]);
        blk_max = std::max(blk_max, epos[e]);
      }
    }
    if (blk_min > max_pos || blk_max <= min_low) continue;  // no query of the task sees it
    const uint16_t* kb = a.K + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
    const uint16_t* vb = a.V + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
    for (size_t e = 0; e < kBlock; ++e)
      for (int c = 0; c < NC; ++c) {
        const __m512 k = e < bn ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb + e * kv_stride + 16 * c)))
                                : _mm512_setzero_ps();
        const __m512 v = e < bn ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + e * kv_stride + 16 * c)))
                                : _mm512_setzero_ps();
        _mm512_store_ps(vt + e * hd + 16 * c, v);
        alignas(64) float kr[16];
        _mm512_store_ps(kr, k);
        for (int d = 0; d < 16; ++d) kt[(16 * c + d) * kBlock + e] = kr[d];
      }
    const __m512i ep[4] = {_mm512_load_si512(epos), _mm512_load_si512(epos + 16), _mm512_load_si512(epos + 32),
                           _mm512_load_si512(epos + 48)};

    for (size_t q0 = 0; q0 < nq_pad; q0 += kScoreQueries) {
      // Scores of 4 queries x 64 entries.
      __m512 acc[kScoreQueries][4];
      for (int j = 0; j < kScoreQueries; ++j)
        for (int c = 0; c < 4; ++c) acc[j][c] = _mm512_setzero_ps();
      for (int d = 0; d < hd; ++d) {
        const float* kd = kt + d * kBlock;
        const __m512 k0 = _mm512_load_ps(kd), k1 = _mm512_load_ps(kd + 16), k2 = _mm512_load_ps(kd + 32),
                     k3 = _mm512_load_ps(kd + 48);
        for (int j = 0; j < kScoreQueries; ++j) {
          const __m512 qd = _mm512_set1_ps(qs[(q0 + j) * hd + d]);
          acc[j][0] = _mm512_fmadd_ps(qd, k0, acc[j][0]);
          acc[j][1] = _mm512_fmadd_ps(qd, k1, acc[j][1]);
          acc[j][2] = _mm512_fmadd_ps(qd, k2, acc[j][2]);
          acc[j][3] = _mm512_fmadd_ps(qd, k3, acc[j][3]);
        }
      }
      float alpha[kScoreQueries];
      bool any = false;
      for (int j = 0; j < kScoreQueries; ++j) {
        const size_t qi = q0 + j;
        __mmask16 vis[4];
        __m512 mx = _mm512_set1_ps(kNegInf);
        for (int c = 0; c < 4; ++c) {
          vis[c] = _mm512_cmple_epi32_mask(ep[c], _mm512_set1_epi32(qpos[qi])) &
                   _mm512_cmpgt_epi32_mask(ep[c], _mm512_set1_epi32(qlow[qi]));
          mx = _mm512_mask_max_ps(mx, vis[c], mx, acc[j][c]);
        }
        const float m_new = std::max(m[qi], _mm512_reduce_max_ps(mx));
        float* pj = p + j * kBlock;
        if (m_new == kNegInf) {  // nothing visible yet: o, l, m stay
          alpha[j] = 1.f;
          std::fill_n(pj, kBlock, 0.f);
          continue;
        }
        any = true;
        const __m512 mv = _mm512_set1_ps(m_new);
        __m512 sum = _mm512_setzero_ps();
        for (int c = 0; c < 4; ++c) {
          const __m512 pc = _mm512_maskz_mov_ps(vis[c], exp16(_mm512_sub_ps(acc[j][c], mv)));
          _mm512_store_ps(pj + 16 * c, pc);
          sum = _mm512_add_ps(sum, pc);
        }
        alpha[j] = m[qi] == kNegInf ? 0.f : _mm512_cvtss_f32(exp16(_mm512_set1_ps(m[qi] - m_new)));
        l[qi] = l[qi] * alpha[j] + _mm512_reduce_add_ps(sum);
        m[qi] = m_new;
      }
      if (!any) continue;
      // o = o * alpha + P V, kOutQueries queries at a time.
      for (int j0 = 0; j0 < kScoreQueries; j0 += kOutQueries) {
        __m512 out[kOutQueries][NC];
        for (int j = 0; j < kOutQueries; ++j) {
          const __m512 al = _mm512_set1_ps(alpha[j0 + j]);
          for (int c = 0; c < NC; ++c) out[j][c] = _mm512_mul_ps(_mm512_load_ps(o + (q0 + j0 + j) * hd + 16 * c), al);
        }
        for (size_t e = 0; e < bn; ++e) {
          const float* ve = vt + e * hd;
          for (int c = 0; c < NC; ++c) {
            const __m512 v = _mm512_load_ps(ve + 16 * c);
            for (int j = 0; j < kOutQueries; ++j)
              out[j][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[(j0 + j) * kBlock + e]), v, out[j][c]);
          }
        }
        for (int j = 0; j < kOutQueries; ++j)
          for (int c = 0; c < NC; ++c) _mm512_store_ps(o + (q0 + j0 + j) * hd + 16 * c, out[j][c]);
      }
    }
  }

  for (size_t qi = 0; qi < nq; ++qi) {
    const size_t r = qi / group, j = qi % group;
    float* dst = a.out + (a.row_begin + r) * q_stride + (static_cast<size_t>(a.kv_head) * group + j) * hd;
    const __m512 inv = _mm512_set1_ps(l[qi] > 0.f ? 1.0f / l[qi] : 0.f);  // no entry seen: zeros
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(dst + 16 * c, _mm512_mul_ps(_mm512_load_ps(o + qi * hd + 16 * c), inv));
  }
}

template <size_t... I>
constexpr auto flash_table(std::index_sequence<I...>) {
  return std::array<void (*)(const TileArgs&, std::vector<float>&), sizeof...(I)>{&flash_tile<static_cast<int>(I) + 1>...};
}

}  // namespace

void attend_tile_flash_avx512(const TileArgs& a, std::vector<float>& scratch) {
  static constexpr auto table = flash_table(std::make_index_sequence<16>{});  // head_dim 16..256
  table[static_cast<size_t>(a.s->head_dim / 16 - 1)](a, scratch);
}

}  // namespace cf::rk

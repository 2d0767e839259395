// Batched attention on AMX BF16 tiles (prefill and recomputed rows under CHUNKFUSE_ISA=amx):
// attention_flash.h's online softmax, with Q.K and P.V on TDPBF16PS and the softmax on
// AVX-512. Held to the numerics contract by tolerance (docs/ARCHITECTURE.md, "Numerics
// contract"; tests/runtime/test_attention_order.cpp, AttentionContract*OnAmx), like the
// AVX-512 kernel it replaces for head dims that are a multiple of 32.
//
// Why: at 2048 tokens attention is ~11% of a prefill's multiply-adds but, in float on AVX-512,
// took as long as every weight matrix on the AMX GEMM together (perf: 28% of the samples).
//
// Layout, transposed so that one vector lane is one query: per block of 32 cache entries and
// group of 16 queries, S^T = K Q^T (C tile: 16 entries x 16 queries; A = K rows as stored,
// B = Q^T in TDPBF16PS's pair rows, made once per task), the softmax runs down the columns
// (per lane: the running maximum m, sum l), P^T's consecutive rows interleave into the B
// tile of O^T = V^T P^T (A = V^T, transposed once per block and shared by every group).
//
// Precision: BF16 keeps 8 significant bits, so every operand is split into hi = bf16(x) and
// lo = bf16(x - hi) and each product takes four tile products (hi.hi + hi.lo + lo.hi +
// lo.lo). K, V (f16 in the cache) and Q (rounded to f16; the score scale is applied to the
// sums) are exact as hi + lo, so Q.K is float's; P keeps ~16 bits (a 3-product version, and
// one with the scale in Q, missed the contract's 2e-5 by 20%). Sums are fp32 in the tiles.
//
// A query's result depends only on its own q, position and the cache (a block that none of
// its lanes sees leaves m, l and o as they were: alpha is exactly 1, P is 0), so a row gives
// the same bits in any batch (AttentionOrderShapes.BatchedRowIndependentOfItsBatch).
// GCC 12 reports its own _mm512_undefined_* helpers as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "model/amx_tiles.h"
#include "runtime/exp_simd.h"
#include "runtime/runtime_kernels.h"

namespace cf::rk {
namespace {

constexpr size_t kE = 32;       // cache entries per block: one P.V tile product's K
constexpr size_t kTile = 1024;  // bytes of one tile (16 rows x 64 bytes)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 16 floats as BF16 hi = bf16(x) and lo = bf16(x - hi), each 16 values.
inline void split16(__m512 x, __m256i& hi, __m256i& lo) {
  const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
  const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  hi = h;
  lo = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_sub_ps(x, hf)));
}

// Two rows of 16 BF16 values a, b as one pair row: a0 b0 a1 b1 ... a15 b15.
inline __m512i pair_rows(__m256i a, __m256i b) {
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(pairs, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
}

// hi.hi + hi.lo + lo.hi + lo.lo into tile C.
#define CF_AMX_SPLIT_PRODUCT(c, ah, al, bh, bl) \
  do {                                          \
    _tile_dpbf16ps(c, ah, bh);                  \
    _tile_dpbf16ps(c, ah, bl);                  \
    _tile_dpbf16ps(c, al, bh);                  \
    _tile_dpbf16ps(c, al, bl);                  \
  } while (0)

template <int HD>
void amx_flash(const TileArgs& a, std::vector<float>& scratch) {
  constexpr int NT = HD / 32;  // K steps of Q.K (32 dims each)
  constexpr int ND = HD / 16;  // O^T tiles (16 dims each)
  const AttentionShape& s = *a.s;
  const int group = s.n_heads / s.n_kv_heads;
  const size_t q_stride = static_cast<size_t>(s.n_heads) * HD;
  const size_t kv_stride = static_cast<size_t>(s.n_kv_heads) * HD;
  const size_t nq = (a.row_end - a.row_begin) * static_cast<size_t>(group);
  const size_t ng = (nq + 15) / 16;
  const float scale = s.score_scale(), q_pre = s.q_prescale();

  // Scratch, 64-byte aligned: qb [ng][NT][hi, lo] B tiles of Q^T | o [ng][HD][16] | m, l
  // [ng][16] | qpos, qlow [ng][16] | kb [hi, lo][kE][HD] BF16 | vt [hi, lo][ND] A tiles of
  // V^T | st [kE][16] | pb [hi, lo] B tiles of P^T | pv [HD][16] | vrow [hi, lo][kE][HD].
  const size_t qb_bytes = ng * NT * 2 * kTile, o_bytes = ng * HD * 16 * 4, ml_bytes = ng * 16 * 4;
  const size_t kb_bytes = 2 * kE * HD * 2, vt_bytes = 2 * ND * kTile, st_bytes = kE * 16 * 4;
  const size_t pb_bytes = 2 * kTile, pv_bytes = HD * 16 * 4, vrow_bytes = 2 * kE * HD * 2;
  const size_t total = qb_bytes + o_bytes + 4 * ml_bytes + kb_bytes + vt_bytes + st_bytes + pb_bytes + pv_bytes + vrow_bytes;
  scratch.resize(total / 4 + 32);
  auto* p8 = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  uint8_t* qb = p8;
  float* o = reinterpret_cast<float*>(qb + qb_bytes);
  float* m = o + ng * HD * 16;
  float* l = m + ng * 16;
  auto* qpos = reinterpret_cast<int32_t*>(l + ng * 16);
  int32_t* qlow = qpos + ng * 16;
  auto* kb = reinterpret_cast<uint16_t*>(qlow + ng * 16);  // [2][kE][HD]
  auto* vt = reinterpret_cast<uint8_t*>(kb + 2 * kE * HD);  // [2][ND] tiles
  auto* st = reinterpret_cast<float*>(vt + vt_bytes);       // [kE][16]
  auto* pb = reinterpret_cast<uint8_t*>(st + kE * 16);      // [2] tiles
  auto* pv = reinterpret_cast<float*>(pb + pb_bytes);       // [HD][16]
  auto* vrow = reinterpret_cast<uint16_t*>(pv + HD * 16);   // [2][kE][HD]

  // Q^T per group: hi/lo BF16 of each query's f16-rounded, scaled q, then the 16 x 16 words
  // (dim pairs x queries) of each K step transposed into B's pair rows.
  int32_t max_pos = std::numeric_limits<int32_t>::min(), min_low = std::numeric_limits<int32_t>::max();
  for (size_t g = 0; g < ng; ++g) {
    alignas(64) uint16_t qh[16][HD], ql[16][HD];
    for (size_t n = 0; n < 16; ++n) {
      const size_t qi = g * 16 + n;
      alignas(64) float qf[HD];
      if (qi >= nq) {  // padding lanes: see nothing, their results are dropped
        std::fill_n(qf, HD, 0.f);
        qpos[qi] = std::numeric_limits<int32_t>::min();
        qlow[qi] = std::numeric_limits<int32_t>::max();
      } else {
        const size_t r = qi / group, j = qi % group;
        const float* src = a.q + (a.row_begin + r) * q_stride + (static_cast<size_t>(a.kv_head) * group + j) * HD;
        // Rounded to f16 (as every kernel's Q.K input), scaled after the product: an f16 value
        // is exact as hi + lo, so the four split products give q.k as float sums would.
        const __m512 pre = _mm512_set1_ps(q_pre);
        for (int d = 0; d < HD; d += 16)
          _mm512_store_ps(qf + d, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(src + d), pre),
                                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        qpos[qi] = a.row_pos[a.row_begin + r];
        qlow[qi] = s.window > 0 ? qpos[qi] - s.window : std::numeric_limits<int32_t>::min();
        max_pos = std::max(max_pos, qpos[qi]);
        min_low = std::min(min_low, qlow[qi]);
      }
      for (int c = 0; c < ND; ++c) {
        __m256i h, lo;
        split16(_mm512_load_ps(qf + 16 * c), h, lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(&qh[n][16 * c]), h);
        _mm256_store_si256(reinterpret_cast<__m256i*>(&ql[n][16 * c]), lo);
      }
      m[qi] = kNegInf;
      l[qi] = 0.f;
    }
    for (int t = 0; t < NT; ++t)
      for (int half = 0; half < 2; ++half) {
        auto* dst = reinterpret_cast<uint32_t*>(qb + ((g * NT + t) * 2 + half) * kTile);
        for (int k = 0; k < 16; ++k)
          for (int n = 0; n < 16; ++n) {
            uint32_t w;
            std::memcpy(&w, &(half ? ql : qh)[n][32 * t + 2 * k], 4);
            dst[16 * k + n] = w;
          }
      }
  }
  std::fill_n(o, ng * HD * 16, 0.f);

  static const kern::AmxTileConfig config;
  _tile_loadconfig(&config);
  const size_t n_blocks = (a.n_entries + kE - 1) / kE;
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t b0 = b * kE, bn = std::min(kE, a.n_entries - b0);
    alignas(64) int32_t epos[kE];
    const auto [blk_min, blk_max] = block_entry_positions(a.entry_pos, b0, bn, epos, kE);
    if (blk_min > max_pos || blk_max <= min_low) continue;  // no query of the task sees it
    // K (rows as stored) and V rows of the block as hi/lo BF16; V^T into A tiles.
    const uint16_t* kc = a.K + b0 * kv_stride + static_cast<size_t>(a.kv_head) * HD;
    const uint16_t* vc = a.V + b0 * kv_stride + static_cast<size_t>(a.kv_head) * HD;
    for (size_t e = 0; e < kE; ++e)
      for (int c = 0; c < ND; ++c) {
        const bool live = e < bn;
        const __m512 k = live ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kc + e * kv_stride + 16 * c)))
                              : _mm512_setzero_ps();
        const __m512 v = live ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vc + e * kv_stride + 16 * c)))
                              : _mm512_setzero_ps();
        __m256i h, lo;
        split16(k, h, lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(kb + e * HD + 16 * c), h);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(kb + kE * HD + e * HD + 16 * c), lo);
        split16(v, h, lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(vrow + e * HD + 16 * c), h);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(vrow + kE * HD + e * HD + 16 * c), lo);
      }
    // V^T tile j, row r (dim 16 j + r): entries 0..31. Entry pair k's words (V[2k][d],
    // V[2k+1][d]) for the tile's 16 dims are one pair_rows; the tile is their 16 x 16 word
    // transpose, one gather a row (a scalar 16-bit transpose was a fifth of this kernel).
    const __m512i word_col = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                _mm512_set1_epi32(16));
    for (int half = 0; half < 2; ++half)
      for (int j = 0; j < ND; ++j) {
        alignas(64) uint32_t words[16 * 16];  // [entry pair k][dim r]
        const uint16_t* src = vrow + half * kE * HD + 16 * j;
        for (int k = 0; k < 16; ++k) {
          const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (2 * k) * HD));
          const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (2 * k + 1) * HD));
          _mm512_store_si512(words + 16 * k, pair_rows(a0, a1));
        }
        uint8_t* dst = vt + (half * ND + j) * kTile;
        for (int r = 0; r < 16; ++r)
          _mm512_store_si512(dst + 64 * r, _mm512_i32gather_epi32(word_col, words + r, 4));
      }

    for (size_t g = 0; g < ng; ++g) {
      const __m512i gpos = _mm512_load_si512(qpos + 16 * g), glow = _mm512_load_si512(qlow + 16 * g);
      if (blk_min > _mm512_reduce_max_epi32(gpos) || blk_max <= _mm512_reduce_min_epi32(glow)) continue;
      // S^T (entries 0..15 in tile 0, 16..31 in tile 1) = K Q^T, in four split products.
      _tile_zero(0);
      _tile_zero(1);
      for (int t = 0; t < NT; ++t) {
        const uint8_t* qt = qb + (g * NT + t) * 2 * kTile;
        const uint8_t* kt = reinterpret_cast<const uint8_t*>(kb) + 64 * t;
        constexpr size_t kRow = HD * 2, kLo = kE * HD * 2;
        _tile_loadd(6, qt, 64);
        _tile_loadd(7, qt + kTile, 64);
        _tile_loadd(2, kt, kRow);
        _tile_loadd(3, kt + kLo, kRow);
        _tile_loadd(4, kt + 16 * kRow, kRow);
        _tile_loadd(5, kt + kLo + 16 * kRow, kRow);
        CF_AMX_SPLIT_PRODUCT(0, 2, 3, 6, 7);
        CF_AMX_SPLIT_PRODUCT(1, 4, 5, 6, 7);
      }
      _tile_stored(0, st, 64);
      _tile_stored(1, st + 16 * 16, 64);

      // The online softmax down the columns: per lane (query) m, l; P^T into B pair rows.
      __mmask16 vis[kE];
      __mmask16 seen = 0;
      __m512 mx = _mm512_set1_ps(kNegInf);
      const __m512 scale_v = _mm512_set1_ps(scale);
      for (size_t e = 0; e < kE; ++e) {
        const __m512i ep = _mm512_set1_epi32(epos[e]);
        vis[e] = _mm512_cmpge_epi32_mask(gpos, ep) & _mm512_cmplt_epi32_mask(glow, ep);
        seen |= vis[e];
        const __m512 sc = _mm512_mul_ps(_mm512_load_ps(st + 16 * e), scale_v);
        _mm512_store_ps(st + 16 * e, sc);
        mx = _mm512_mask_max_ps(mx, vis[e], mx, sc);
      }
      if (!seen) continue;  // no lane sees an entry of the block: m, l, o stay
      const __m512 m_old = _mm512_load_ps(m + 16 * g);
      const __m512 m_new = _mm512_max_ps(m_old, mx);
      const __mmask16 none = _mm512_cmp_ps_mask(m_new, _mm512_set1_ps(kNegInf), _CMP_EQ_OQ);
      // exp(-inf - finite) is 0 (a first block seen); lanes that have seen nothing keep 1.
      const __m512 alpha = _mm512_mask_blend_ps(none, exp16(_mm512_sub_ps(m_old, m_new)), _mm512_set1_ps(1.f));
      __m512 sum = _mm512_setzero_ps();
      for (size_t e = 0; e < kE; e += 2) {
        const __m512 p0 = _mm512_maskz_mov_ps(vis[e], exp16(_mm512_sub_ps(_mm512_load_ps(st + 16 * e), m_new)));
        const __m512 p1 = _mm512_maskz_mov_ps(vis[e + 1], exp16(_mm512_sub_ps(_mm512_load_ps(st + 16 * (e + 1)), m_new)));
        sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
        __m256i h0, l0, h1, l1;
        split16(p0, h0, l0);
        split16(p1, h1, l1);
        _mm512_store_si512(pb + 64 * (e / 2), pair_rows(h0, h1));
        _mm512_store_si512(pb + kTile + 64 * (e / 2), pair_rows(l0, l1));
      }
      _mm512_store_ps(l + 16 * g, _mm512_fmadd_ps(_mm512_load_ps(l + 16 * g), alpha, sum));
      _mm512_store_ps(m + 16 * g, m_new);

      // O^T = O^T alpha + V^T P^T, four 16-dim tiles at a time.
      _tile_loadd(6, pb, 64);
      _tile_loadd(7, pb + kTile, 64);
      for (int j0 = 0; j0 < ND; j0 += 4) {
        const int nj = std::min(4, ND - j0);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int j = 0; j < nj; ++j) {
          _tile_loadd(4, vt + (j0 + j) * kTile, 64);
          _tile_loadd(5, vt + (ND + j0 + j) * kTile, 64);
          switch (j) {  // tile numbers are immediates
            case 0: CF_AMX_SPLIT_PRODUCT(0, 4, 5, 6, 7); break;
            case 1: CF_AMX_SPLIT_PRODUCT(1, 4, 5, 6, 7); break;
            case 2: CF_AMX_SPLIT_PRODUCT(2, 4, 5, 6, 7); break;
            default: CF_AMX_SPLIT_PRODUCT(3, 4, 5, 6, 7); break;
          }
        }
        float* pvj = pv + j0 * 16 * 16;
        _tile_stored(0, pvj, 64);
        if (nj > 1) _tile_stored(1, pvj + 256, 64);
        if (nj > 2) _tile_stored(2, pvj + 512, 64);
        if (nj > 3) _tile_stored(3, pvj + 768, 64);
      }
      float* og = o + g * HD * 16;
      for (int d = 0; d < HD; ++d)
        _mm512_store_ps(og + 16 * d, _mm512_fmadd_ps(_mm512_load_ps(og + 16 * d), alpha, _mm512_load_ps(pv + 16 * d)));
    }
  }
  _tile_release();

  for (size_t qi = 0; qi < nq; ++qi) {
    const size_t g = qi / 16, n = qi % 16, r = qi / group, j = qi % group;
    float* dst = a.out + (a.row_begin + r) * q_stride + (static_cast<size_t>(a.kv_head) * group + j) * HD;
    const float inv = l[qi] > 0.f ? 1.0f / l[qi] : 0.f;  // no entry seen: zeros
    const float* og = o + g * HD * 16 + n;
    for (int d = 0; d < HD; ++d) dst[d] = og[16 * d] * inv;
  }
}
#undef CF_AMX_SPLIT_PRODUCT

}  // namespace

// Head dims 32, 64, ..., 256; others take the AVX-512 kernel.
bool attend_tile_flash_amx(const TileArgs& a, std::vector<float>& scratch) {
  switch (a.s->head_dim) {
    case 32: amx_flash<32>(a, scratch); return true;
    case 64: amx_flash<64>(a, scratch); return true;
    case 96: amx_flash<96>(a, scratch); return true;
    case 128: amx_flash<128>(a, scratch); return true;
    case 160: amx_flash<160>(a, scratch); return true;
    case 192: amx_flash<192>(a, scratch); return true;
    case 224: amx_flash<224>(a, scratch); return true;
    case 256: amx_flash<256>(a, scratch); return true;
    default: return false;
  }
}

}  // namespace cf::rk

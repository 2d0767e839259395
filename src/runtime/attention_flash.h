// Batched attention in an order of our own (prefill and recomputed rows:
// TileArgs::single_row_order false), held to the numerics contract by tolerance
// (docs/ARCHITECTURE.md, "Numerics contract"; tests/runtime/test_attention_order.cpp,
// AttentionContract*), not to llama.cpp's bits as the portable kernel and every decode step
// are. One algorithm, instantiated per ISA with that ISA's vector type (S below:
// attention_flash_avx512.cpp, attention_flash_avx2.cpp).
//
// One pass over the cache in blocks of 4 vectors of entries (64 on AVX-512, 32 on AVX2)
// with an online softmax (FlashAttention's recurrence: per query a running maximum m, sum
// l and output o; a block with a higher maximum rescales l and o by exp(m_old - m_new)),
// where the llama.cpp order needs all scores first, then the softmax, then P.V in 16 lanes
// per output. Per block the entries' K are converted to float once (transposed,
// [d][entry]) and V once ([entry][d]) and shared by every query of the task (its rows x the
// KV head's query heads); the score and P.V loops are register-blocked over queries (S's
// kScoreQueries queries x the block's entries; up to S's kAccRegs accumulators of hd in
// P.V, out_block) so that one loaded vector feeds several fmas. Per block the scores of
// every query of the task come first, then every P.V, so that K's block and then V's
// stays in L1 while its loop sweeps the queries. Everything stays in float: Q rounded to
// f16 (as llama.cpp's Q.K input is) and scaled, P not rounded to f16 (llama.cpp rounds it),
// so the result is closer to the exact attention than llama.cpp's (the tests measure it).
//
// A query's result depends only on its own q, position and the cache: not on the other rows
// of its task (blocks no query of the task sees are skipped, and a block a query does not
// see leaves its m, l and o exactly as they were), so a row gives the same bits in any batch.
//
// S provides: F (float vector of W lanes), I (int32 vector), M (lane mask), kScoreQueries,
// kAccRegs; zero, set1, load, store, fmadd, mul, add, sub, load_i, visible(e, pos, low)
// (low < e <= pos), masked_max(mx, m, v), maskz(m, v), reduce_max, reduce_add, first, exp (of
// x <= 0; a lane the caller masks off may hold any value), cvtph (W f16 values from memory).
// Internal linkage on purpose (as kernels_panel.h): each ISA's file compiles this with its own
// flags.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "runtime/runtime_kernels.h"

namespace cf::rk {
namespace {

inline float flash_f16_round(float x) { return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); }

// P.V's register block: q queries x c vectors of hd (c divides nc, q x c <= regs
// accumulators, q <= 4) with the fewest loads per fma, (q + c) / (q c): each entry loads c V
// vectors and q probabilities for q x c fmas. Ties take the wider c (fewer passes over o).
struct OutBlock {
  int queries, vectors;
};
constexpr OutBlock out_block(int nc, int regs) {
  OutBlock best{1, 1};
  for (int c = 1; c <= nc && c <= regs; ++c)
    for (int q = 1; q <= 4 && q * c <= regs; ++q) {
      if (nc % c != 0) continue;
      const int lhs = (q + c) * best.queries * best.vectors, rhs = (best.queries + best.vectors) * q * c;
      if (lhs < rhs || (lhs == rhs && c > best.vectors)) best = {q, c};
    }
  return best;
}

// S may transpose W x W floats in registers (S::transpose(F rows[W])); others take the scalar loop.
template <class S>
concept HasTranspose = requires(typename S::F* rows) { S::transpose(rows); };

// S may pin a vector to a register (S::pin(F&)): GCC otherwise folds a V load into each of the
// fmas that use it, and P.V's loads then outnumber what the load ports take beside its fmas.
template <class S>
concept HasPin = requires(typename S::F& v) { S::pin(v); };

// hd = head_dim = W * NC.
template <class S, int NC>
void flash_tile(const TileArgs& a, std::vector<float>& scratch) {
  using F = typename S::F;
  constexpr int W = S::W, hd = W * NC, kQ = S::kScoreQueries;
  constexpr size_t kEntries = 4 * W;  // cache entries per block: 4 score vectors per query
  // P.V: kOutQueries queries x kOutC vectors of hd at a time (at most kAccRegs).
  constexpr int kOutC = out_block(NC, S::kAccRegs).vectors;
  constexpr int kOutQueries = out_block(NC, S::kAccRegs).queries;
  constexpr size_t kQueryPad = std::lcm(kQ, kOutQueries);  // both loops step through whole groups
  static_assert(NC % kOutC == 0);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const AttentionShape& s = *a.s;
  const int group = s.n_heads / s.n_kv_heads;
  const size_t q_stride = static_cast<size_t>(s.n_heads) * hd;
  const size_t kv_stride = static_cast<size_t>(s.n_kv_heads) * hd;
  const size_t n_rows = a.row_end - a.row_begin;
  const size_t nq = n_rows * static_cast<size_t>(group);
  const size_t nq_pad = (nq + kQueryPad - 1) / kQueryPad * kQueryPad;
  const float scale = s.score_scale(), q_pre = s.q_prescale();

  // scratch: kt [hd][E] | vt [E][hd] | q [nq_pad][hd] | o [nq_pad][hd] | p [nq_pad][E] | m, l,
  // alpha, qpos, qlow [nq_pad] | seen [nq_pad] (bytes)
  scratch.resize(2 * hd * kEntries + 2 * nq_pad * hd + nq_pad * kEntries + 6 * nq_pad + 16);
  float* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  float* kt = base;
  float* vt = kt + hd * kEntries;
  float* qs = vt + hd * kEntries;
  float* o = qs + nq_pad * hd;
  float* p = o + nq_pad * hd;
  float* m = p + nq_pad * kEntries;
  float* l = m + nq_pad;
  float* alpha = l + nq_pad;
  auto* qpos = reinterpret_cast<int32_t*>(alpha + nq_pad);
  int32_t* qlow = qpos + nq_pad;
  auto* seen = reinterpret_cast<uint8_t*>(qlow + nq_pad);  // the query saw an entry of the block

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
      for (int d = 0; d < hd; ++d) dst[d] = flash_f16_round(src[d] * q_pre) * scale;
      qpos[qi] = a.row_pos[a.row_begin + r];
      qlow[qi] = s.window > 0 ? qpos[qi] - s.window : std::numeric_limits<int32_t>::min();
      max_pos = std::max(max_pos, qpos[qi]);
      min_low = std::min(min_low, qlow[qi]);
    }
    std::fill_n(o + qi * hd, hd, 0.f);
    m[qi] = kNegInf;
    l[qi] = 0.f;
  }

  const size_t n_blocks = (a.n_entries + kEntries - 1) / kEntries;
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t b0 = b * kEntries, bn = std::min(kEntries, a.n_entries - b0);
    alignas(64) int32_t epos[kEntries];
    const auto [blk_min, blk_max] = block_entry_positions(a.entry_pos, b0, bn, epos, kEntries);
    if (blk_min > max_pos || blk_max <= min_low) continue;  // no query of the task sees it
    const uint16_t* kb = a.K + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
    const uint16_t* vb = a.V + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
    for (size_t e = 0; e < kEntries; ++e)
      for (int c = 0; c < NC; ++c) S::store(vt + e * hd + W * c, e < bn ? S::cvtph(vb + e * kv_stride + W * c) : S::zero());
    if constexpr (HasTranspose<S>) {  // W entries x W dims at a time
      for (size_t e0 = 0; e0 < kEntries; e0 += W)
        for (int c = 0; c < NC; ++c) {
          F rows[W];
          for (int i = 0; i < W; ++i) rows[i] = e0 + i < bn ? S::cvtph(kb + (e0 + i) * kv_stride + W * c) : S::zero();
          S::transpose(rows);
          for (int d = 0; d < W; ++d) S::store(kt + (W * c + d) * kEntries + e0, rows[d]);
        }
    } else {
      for (size_t e = 0; e < kEntries; ++e)
        for (int c = 0; c < NC; ++c) {
          alignas(64) float kr[W];
          S::store(kr, e < bn ? S::cvtph(kb + e * kv_stride + W * c) : S::zero());
          for (int d = 0; d < W; ++d) kt[(W * c + d) * kEntries + e] = kr[d];
        }
    }
    const typename S::I ep[4] = {S::load_i(epos), S::load_i(epos + W), S::load_i(epos + 2 * W), S::load_i(epos + 3 * W)};

    // Scores and softmax of every query first, then P.V of every query: a block's K and V
    // (hd x E floats each: 16 KB apiece at hd 128 on AVX2) do not fit L1 together, but each
    // alone does while its loop sweeps the task's queries.
    for (size_t q0 = 0; q0 < nq_pad; q0 += kQ) {
      // Scores of kQ queries x the block's entries.
      F acc[kQ][4];
      for (int j = 0; j < kQ; ++j)
        for (int c = 0; c < 4; ++c) acc[j][c] = S::zero();
      for (int d = 0; d < hd; ++d) {
        const float* kd = kt + d * kEntries;
        const F k0 = S::load(kd), k1 = S::load(kd + W), k2 = S::load(kd + 2 * W), k3 = S::load(kd + 3 * W);
        for (int j = 0; j < kQ; ++j) {
          const F qd = S::set1(qs[(q0 + j) * hd + d]);
          acc[j][0] = S::fmadd(qd, k0, acc[j][0]);
          acc[j][1] = S::fmadd(qd, k1, acc[j][1]);
          acc[j][2] = S::fmadd(qd, k2, acc[j][2]);
          acc[j][3] = S::fmadd(qd, k3, acc[j][3]);
        }
      }
      for (int j = 0; j < kQ; ++j) {
        const size_t qi = q0 + j;
        typename S::M vis[4];
        F mx = S::set1(kNegInf);
        for (int c = 0; c < 4; ++c) {
          vis[c] = S::visible(ep[c], qpos[qi], qlow[qi]);
          mx = S::masked_max(mx, vis[c], acc[j][c]);
        }
        const float m_new = std::max(m[qi], S::reduce_max(mx));
        float* pj = p + qi * kEntries;
        seen[qi] = m_new != kNegInf;
        if (!seen[qi]) {  // nothing visible yet: o, l, m stay
          alpha[qi] = 1.f;
          std::fill_n(pj, kEntries, 0.f);
          continue;
        }
        const F mv = S::set1(m_new);
        F sum = S::zero();
        for (int c = 0; c < 4; ++c) {
          const F pc = S::maskz(vis[c], S::exp(S::sub(acc[j][c], mv)));
          S::store(pj + W * c, pc);
          sum = S::add(sum, pc);
        }
        // The maximum moves in few blocks once a query has seen its larger scores.
        alpha[qi] = m[qi] == kNegInf ? 0.f : m[qi] == m_new ? 1.f : S::first(S::exp(S::set1(m[qi] - m_new)));
        l[qi] = l[qi] * alpha[qi] + S::reduce_add(sum);
        m[qi] = m_new;
      }
    }
    // o = o * alpha + P V, kOutQueries queries x kOutC vectors at a time; a group none of whose
    // queries saw the block is skipped.
    for (size_t q0 = 0; q0 < nq_pad; q0 += kOutQueries) {
      if (std::none_of(seen + q0, seen + q0 + kOutQueries, [](uint8_t v) { return v != 0; })) continue;
      for (int c0 = 0; c0 < NC; c0 += kOutC) {
        F out[kOutQueries][kOutC];
        for (int j = 0; j < kOutQueries; ++j) {
          const F al = S::set1(alpha[q0 + j]);
          for (int c = 0; c < kOutC; ++c) out[j][c] = S::mul(S::load(o + (q0 + j) * hd + W * (c0 + c)), al);
        }
        for (size_t e = 0; e < bn; ++e) {
          const float* ve = vt + e * hd + W * c0;
          F pj[kOutQueries];
          for (int j = 0; j < kOutQueries; ++j) pj[j] = S::set1(p[(q0 + j) * kEntries + e]);
          for (int c = 0; c < kOutC; ++c) {
            F v = S::load(ve + W * c);
            if constexpr (HasPin<S>) S::pin(v);
            for (int j = 0; j < kOutQueries; ++j) out[j][c] = S::fmadd(pj[j], v, out[j][c]);
          }
        }
        for (int j = 0; j < kOutQueries; ++j)
          for (int c = 0; c < kOutC; ++c) S::store(o + (q0 + j) * hd + W * (c0 + c), out[j][c]);
      }
    }
  }

  for (size_t qi = 0; qi < nq; ++qi) {
    const size_t r = qi / group, j = qi % group;
    float* dst = a.out + (a.row_begin + r) * q_stride + (static_cast<size_t>(a.kv_head) * group + j) * hd;
    const F inv = S::set1(l[qi] > 0.f ? 1.0f / l[qi] : 0.f);  // no entry seen: zeros
    for (int c = 0; c < NC; ++c) S::storeu(dst + W * c, S::mul(S::load(o + qi * hd + W * c), inv));
  }
}

// Head dims 16, 32, ..., 256 (every file we load); others take the llama.cpp order.
template <class S, size_t... I>
constexpr auto flash_table(std::index_sequence<I...>) {
  return std::array<void (*)(const TileArgs&, std::vector<float>&), sizeof...(I)>{
      &flash_tile<S, static_cast<int>(16 * (I + 1)) / S::W>...};
}

template <class S>
bool flash_attend(const TileArgs& a, std::vector<float>& scratch) {
  static constexpr auto table = flash_table<S>(std::make_index_sequence<16>{});
  const int hd = a.s->head_dim;
  if (hd % 16 != 0 || hd < 16 || hd > 256) return false;
  table[static_cast<size_t>(hd / 16 - 1)](a, scratch);
  return true;
}

}  // namespace
}  // namespace cf::rk

// The attention tile in llama.cpp's (non-flash) CPU order, bit for bit: one algorithm,
// instantiated per ISA with that ISA's hooks (Ops: ScalarOps in runtime_kernels_scalar.h,
// hidden where runtime_kernels_avx2.cpp / runtime_kernels_avx512.cpp vectorize a piece).
// It runs every call on the portable kernels and single rows (decode) on every ISA; batched
// rows on AVX2 and AVX-512 take attention_flash.h first (Ops::batched_tile). Internal
// linkage on purpose: each ISA's file compiles this with its own flags.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/runtime_kernels.h"
#include "runtime/runtime_kernels_scalar.h"

namespace cf::rk {
namespace {

constexpr size_t kDirectDotQueries = 6;  // at most this many queries per tile: no transpose

// o[d] = fma(p, v[d], o[d]) for d < hd, v (a V row) read as f16.
template <class Ops, int HD>
inline void fma_f16_row(float p, const uint16_t* __restrict v, float* __restrict o, int hd) {
  float vf[HD > 0 ? HD : 256];
  f16_to_f32_row<Ops>(v, vf, static_cast<size_t>(hd));
  for (int d = 0; d < hd; ++d) o[d] = fmaf_(p, vf[d], o[d]);
}

// One task: the rows [row_begin, row_end) times the query heads sharing kv_head, over all
// entries. The arithmetic is llama.cpp's (non-flash) CPU attention, operation by
// operation, so that both engines round alike: Q is rounded to f16 (K and V are stored as
// f16, see KvCache, and converted exactly to float as they are loaded); scores are f16
// dot products (dot_batched / dot_single) scaled after the dot; the softmax uses ggml's
// expf, sums each 16 entries with reduce16 and those sums in double, and scales by the
// float of 1/sum; the probabilities are rounded to f16; P.V is
// the same kind of dot over entries (lane = entry index mod 16, or mod 64 for a single
// row). Entry e always sits in lane e mod 16/64 of its block, and every lane sums in entry
// order, so a row's result never depends on which rows share its tile or on the block
// size (a multiple of 64); masked entries add exact zeros, like llama.cpp's padding.
// HD > 0 fixes the head size at compile time; HD == 0 reads it from the shape.
template <class Ops, int HD>
void llama_order_tile(const TileArgs& a, std::vector<float>& scores) {
  static_assert(kBlock % 64 == 0, "lanes must not straddle blocks");
  const int hd = HD > 0 ? HD : a.s->head_dim;
  const int group = a.s->n_heads / a.s->n_kv_heads;
  const size_t q_stride = static_cast<size_t>(a.s->n_heads) * hd;
  const size_t kv_stride = static_cast<size_t>(a.s->n_kv_heads) * hd;
  const size_t n_rows = a.row_end - a.row_begin;
  const size_t nq = n_rows * group;
  const float scale = a.s->score_scale();
  const float q_pre = a.s->q_prescale();
  const size_t n_blocks = (a.n_entries + kBlock - 1) / kBlock;
  const size_t padded = n_blocks * kBlock;
  const bool single = a.single_row_order;
  const size_t lanes = single ? 64 : 16;

  alignas(64) float qs[kMaxQueries * 256];
  alignas(64) float kt[256 * kBlock];
  alignas(64) float part[64 * kBlock];
  alignas(64) float vt[Ops::kConvertsVBlock ? (HD > 0 ? HD : 16) * kBlock : 1];  // one V block as floats (pass 2)
  int32_t qpos[kMaxQueries];
  // Sliding window: a query sees entries with qlow < pos <= qpos (qlow = INT_MIN: no window).
  int32_t qlow[kMaxQueries];
  const int window = a.s->window;

  int32_t max_pos = std::numeric_limits<int32_t>::min();
  int32_t min_low = std::numeric_limits<int32_t>::max();
  for (size_t r = 0; r < n_rows; ++r) {
    const int32_t p = a.row_pos[a.row_begin + r];
    const int32_t low = window > 0 ? p - window : std::numeric_limits<int32_t>::min();
    max_pos = std::max(max_pos, p);
    min_low = std::min(min_low, low);
    for (int j = 0; j < group; ++j) {
      const size_t qi = r * group + j;
      const float* src = a.q + (a.row_begin + r) * q_stride + static_cast<size_t>(a.kv_head * group + j) * hd;
      for (int d = 0; d < hd; ++d) qs[qi * hd + d] = round_f16(src[d] * q_pre);
      qpos[qi] = p;
      qlow[qi] = low;
    }
  }
  // scores [nq][padded], then the P.V lanes [nq][lanes][hd].
  const size_t pv_size = nq * lanes * hd;
  scores.resize(nq * padded + pv_size);
  float* pv = scores.data() + nq * padded;
  std::vector<uint8_t> live(n_blocks, 0);

  // Pass 1: scaled scores of every visible entry (-inf where masked).
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t b0 = b * kBlock;
    const size_t bn = std::min(kBlock, a.n_entries - b0);
    int32_t min_pos = std::numeric_limits<int32_t>::max();
    int32_t blk_max = std::numeric_limits<int32_t>::min();
    for (size_t j = 0; j < bn; ++j) {
      min_pos = std::min(min_pos, a.entry_pos[b0 + j]);
      blk_max = std::max(blk_max, a.entry_pos[b0 + j]);
    }
    // The whole block lies in every row's future, or (sliding window) behind every row's window.
    if (min_pos > max_pos || blk_max <= min_low) {
      for (size_t qi = 0; qi < nq; ++qi) std::fill_n(&scores[qi * padded + b0], kBlock, kNegInf);
      continue;
    }
    live[b] = 1;
    // The block's entry positions, padded with "never visible", so masking vectorizes.
    int32_t epos[kBlock];
    for (size_t j = 0; j < kBlock; ++j) epos[j] = j < bn ? a.entry_pos[b0 + j] : std::numeric_limits<int32_t>::max();
    const uint16_t* kb = a.K + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
    const ScoreBlock blk{qs, qpos, qlow, nq, epos, kb, kv_stride, b0, bn, scores.data(), padded, scale, single};
    if (nq <= kDirectDotQueries) {
      if (Ops::template direct_scores<HD>(blk)) continue;
      // Few queries (decode): one dot product per entry beats transposing the block.
      for (size_t qi = 0; qi < nq; ++qi) {
        float* __restrict s = &scores[qi * padded + b0];
        const float* qv = qs + qi * hd;
        for (size_t j = 0; j < bn; ++j) {
          if (a.entry_pos[b0 + j] > qpos[qi] || a.entry_pos[b0 + j] <= qlow[qi]) {
            s[j] = kNegInf;
            continue;
          }
          const uint16_t* kr = kb + j * kv_stride;
          s[j] = (single ? Ops::dot_single(qv, kr, hd) : Ops::dot_batched(qv, kr, hd)) * scale;
        }
        for (size_t j = bn; j < kBlock; ++j) s[j] = kNegInf;
      }
      continue;
    }
    if (Ops::template row_major_scores<HD>(blk, kt)) continue;
    // K block transposed to [hd][kBlock] so the score loops run along entries; the same
    // lanes and sums as dot_batched / dot_single, entry by entry.
    for (size_t j = 0; j < bn; ++j) {
      float kr[HD > 0 ? HD : 256];
      f16_to_f32_row<Ops>(kb + j * kv_stride, kr, static_cast<size_t>(hd));
      for (int d = 0; d < hd; ++d) kt[d * kBlock + j] = kr[d];
    }
    for (size_t j = bn; j < kBlock; ++j)
      for (int d = 0; d < hd; ++d) kt[d * kBlock + j] = 0.f;
    const int main = single ? (hd & ~63) : hd;
    for (size_t qi = 0; qi < nq; ++qi) {
      const float* __restrict qv = qs + qi * hd;
      if (Ops::transposed_scores(blk, qi, kt, hd)) continue;
      // Lane t of 16 entries at a time: its fma chain over d = t (mod lanes).
      for (size_t t = 0; t < lanes; ++t)
        for (size_t j0 = 0; j0 < kBlock; j0 += 16) {
          float acc[16] = {};
          for (int d = static_cast<int>(t); d < main; d += static_cast<int>(lanes)) {
            const float qd = qv[d];
            const float* __restrict kr = kt + d * kBlock + j0;
            for (int u = 0; u < 16; ++u) acc[u] = fmaf_(qd, kr[u], acc[u]);
          }
          float* __restrict lane = part + t * kBlock + j0;
          for (int u = 0; u < 16; ++u) lane[u] = acc[u];
        }
      if (single) {
        for (size_t t = 0; t < 16; ++t)
          for (size_t j = 0; j < kBlock; ++j)
            part[t * kBlock + j] = (part[t * kBlock + j] + part[(32 + t) * kBlock + j]) +
                                   (part[(16 + t) * kBlock + j] + part[(48 + t) * kBlock + j]);
      }
      // reduce16 over the lanes, entry by entry (each step a loop along entries).
      for (size_t step = 8; step >= 1; step /= 2)
        for (size_t i = 0; i < step; ++i) {
          float* __restrict lo = part + i * kBlock;
          const float* __restrict hi = part + (i + step) * kBlock;
          for (size_t j = 0; j < kBlock; ++j) lo[j] = lo[j] + hi[j];
        }
      float* __restrict s = &scores[qi * padded + b0];
      for (size_t j = 0; j < kBlock; ++j) s[j] = part[j];
      if (main < hd) {  // dot_single's tail, in double
        for (size_t j = 0; j < kBlock; ++j) {
          double sum = s[j];
          for (int d = main; d < hd; ++d) sum += static_cast<double>(qv[d] * kt[d * kBlock + j]);
          s[j] = static_cast<float>(sum);
        }
      }
      for (size_t j = 0; j < kBlock; ++j) {
        s[j] = epos[j] <= qpos[qi] && epos[j] > qlow[qi] ? s[j] * scale : kNegInf;
      }
    }
  }

  // Softmax per query as ggml_vec_soft_max_f32, then rounded to f16 as llama.cpp's P.V
  // input is. Entries past the last live block are all masked: their exact zeros are
  // written, not computed.
  size_t live_end = 0;
  for (size_t b = 0; b < n_blocks; ++b)
    if (live[b]) live_end = (b + 1) * kBlock;
  for (size_t qi = 0; qi < nq; ++qi) {
    float* s = &scores[qi * padded];
    std::fill(s + live_end, s + padded, 0.f);
    alignas(32) float mx_lanes[16];
    Ops::lane_max(s, live_end, mx_lanes);
    float mx = kNegInf;
    for (int t = 0; t < 16; ++t) mx = std::max(mx, mx_lanes[t]);
    if (mx == kNegInf) {
      std::fill_n(s, live_end, 0.f);
      continue;
    }
    for (size_t e = Ops::exp_prefix(s, live_end, mx); e < live_end; ++e) s[e] = s[e] == kNegInf ? 0.f : exp_inline(s[e] - mx);
    const double sum = Ops::sum_of_reduce16(s, live_end);
    const float inv = static_cast<float>(1.0 / sum);
    for (size_t e = Ops::normalize_prefix(s, live_end, inv); e < live_end; ++e) s[e] = round_f16(s[e] * inv);
  }

  // Pass 2: P.V over the live blocks; entry e feeds lane e mod `lanes`.
  std::fill(pv, pv + pv_size, 0.f);
  if (single) {
    // Few queries: each lane runs through all blocks with its accumulator in registers
    // (V, read once per query, stays in cache).
    for (size_t qi = 0; qi < nq; ++qi) {
      const float* __restrict p = &scores[qi * padded];
      for (size_t t = 0; t < lanes; ++t) {
        float* __restrict acc = pv + (qi * lanes + t) * hd;
        const uint16_t* vh = a.V + static_cast<size_t>(a.kv_head) * hd;
        if (Ops::template single_lane_pv<HD>(p, vh, kv_stride, a.n_entries, t, lanes, acc)) continue;
        float o[HD > 0 ? HD : 256];
        for (int d = 0; d < hd; ++d) o[d] = 0.f;
        for (size_t e = t; e < a.n_entries; e += lanes) {
          const float pe = p[e];
          if (pe == 0.f) continue;  // adds an exact zero
          fma_f16_row<Ops, HD>(pe, vh + e * kv_stride, o, hd);
        }
        for (int d = 0; d < hd; ++d) acc[d] = o[d];
      }
    }
  }
  for (size_t b = 0; b < n_blocks && !single; ++b) {
    if (!live[b]) continue;
    const size_t b0 = b * kBlock;
    const size_t bn = std::min(kBlock, a.n_entries - b0);
    const uint16_t* vb = a.V + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
    const PvBlock blk{vb, kv_stride, bn, nq, padded, lanes, hd, vt};
    for (size_t qi = 0; qi < nq; ++qi) {
      const float* __restrict p = &scores[qi * padded + b0];
      float* q_lanes = pv + qi * lanes * hd;
      if (const size_t done = Ops::template block_pv<HD>(blk, qi, p, q_lanes); done > 0) {
        qi += done - 1;  // a pair's second query is done too
        continue;
      }
      for (size_t t = 0; t < lanes && t < bn; ++t) {
        float o[HD > 0 ? HD : 256];  // register-resident when HD is fixed
        float* __restrict acc = q_lanes + t * hd;
        for (int d = 0; d < hd; ++d) o[d] = acc[d];
        // No test for p == 0 (it adds an exact zero, as llama.cpp does): the zeros of the
        // f16-rounded probabilities fall irregularly and the branch mispredicted.
        for (size_t j = t; j < bn; j += lanes) fma_f16_row<Ops, HD>(p[j], vb + j * kv_stride, o, hd);
        for (int d = 0; d < hd; ++d) acc[d] = o[d];
      }
    }
  }

  for (size_t r = 0; r < n_rows; ++r)
    for (int j = 0; j < group; ++j) {
      const size_t qi = r * group + j;
      float* dst = a.out + (a.row_begin + r) * q_stride + static_cast<size_t>(a.kv_head * group + j) * hd;
      float* l = pv + qi * lanes * hd;
      if (single) {
        for (int t = 0; t < 16; ++t)
          for (int d = 0; d < hd; ++d)
            l[t * hd + d] = (l[t * hd + d] + l[(32 + t) * hd + d]) + (l[(16 + t) * hd + d] + l[(48 + t) * hd + d]);
      }
      for (int step = 8; step >= 1; step /= 2)  // reduce16 over the lanes, along d
        for (int i = 0; i < step; ++i)
          for (int d = 0; d < hd; ++d) l[i * hd + d] = l[i * hd + d] + l[(i + step) * hd + d];
      for (int d = 0; d < hd; ++d) dst[d] = l[d];
    }
}

template <class Ops>
void attend_tile(const TileArgs& a, std::vector<float>& scores) {
  // Batched rows on AVX-512 and AVX2: the online-softmax kernel (the contract's tolerance,
  // not llama.cpp's bits); one row alone keeps llama.cpp's decode order below.
  if (!a.single_row_order && Ops::batched_tile(a, scores)) return;
  switch (a.s->head_dim) {
    case 64: return llama_order_tile<Ops, 64>(a, scores);
    case 128: return llama_order_tile<Ops, 128>(a, scores);
    case 256: return llama_order_tile<Ops, 256>(a, scores);  // Gemma 3
    default: return llama_order_tile<Ops, 0>(a, scores);
  }
}

template <class Ops>
void attention_probs_row(const AttentionShape& s, const float* q_row, int32_t row_pos, const uint16_t* K,
                         const int32_t* entry_pos, size_t n_entries, float* probs) {
  // The batched order of attend_tile (scores and softmax), probabilities kept in f32.
  const int hd = s.head_dim;
  const int group = s.n_heads / s.n_kv_heads;
  const size_t kv_stride = static_cast<size_t>(s.n_kv_heads) * hd;
  const float scale = s.score_scale();
  float qh[256];
  for (int h = 0; h < s.n_heads; ++h) {
    float* p = probs + static_cast<size_t>(h) * n_entries;
    for (int d = 0; d < hd; ++d) qh[d] = round_f16(q_row[static_cast<size_t>(h) * hd + d] * s.q_prescale());
    const int g = h / group;
    float mx = kNegInf;
    for (size_t e = 0; e < n_entries; ++e) {
      if (!s.visible(entry_pos[e], row_pos)) {
        p[e] = kNegInf;
        continue;
      }
      p[e] = Ops::dot_batched(qh, K + e * kv_stride + static_cast<size_t>(g) * hd, hd) * scale;
      mx = std::max(mx, p[e]);
    }
    if (mx == kNegInf) {
      std::fill_n(p, n_entries, 0.f);
      continue;
    }
    for (size_t e = 0; e < n_entries; ++e) p[e] = p[e] == kNegInf ? 0.f : exp_inline(p[e] - mx);
    double sum = 0;
    float l[16];
    for (size_t e = 0; e < n_entries; e += 16) {
      for (size_t t = 0; t < 16; ++t) l[t] = e + t < n_entries ? p[e + t] : 0.f;
      sum += static_cast<double>(reduce16(l));
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (size_t e = 0; e < n_entries; ++e) p[e] *= inv;
  }
}

}  // namespace
}  // namespace cf::rk

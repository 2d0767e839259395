#include "runtime/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/thread_pool.h"
#include "runtime/vector_math_impl.h"

namespace cf {
namespace {

constexpr size_t kBlock = 64;        // cache entries per block
constexpr size_t kMaxQueries = 48;   // query vectors (rows x heads of a group) per task
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct TileArgs {
  const AttentionShape* s;
  const float* q;
  const int32_t* row_pos;
  size_t row_begin, row_end;
  int kv_head;
  const float* K;
  const float* V;
  const int32_t* entry_pos;
  size_t n_entries;
  float* out;
};

// One task: the rows [row_begin, row_end) times the query heads sharing kv_head, over all
// entries. The arithmetic follows llama.cpp's (non-flash) CPU attention so that both
// engines round alike: Q is rounded to f16 (K and V already are, see KvCache), scores are
// f32 dot products scaled after the dot, the softmax is normalised before the
// probabilities are rounded to f16, and P.V accumulates in f32.
CF_MULTIVERSION void attend_tile(const TileArgs& a, std::vector<float>& scores) {
  const int hd = a.s->head_dim;
  const int group = a.s->n_heads / a.s->n_kv_heads;
  const size_t q_stride = static_cast<size_t>(a.s->n_heads) * hd;
  const size_t kv_stride = static_cast<size_t>(a.s->n_kv_heads) * hd;
  const size_t n_rows = a.row_end - a.row_begin;
  const size_t nq = n_rows * group;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t n_blocks = (a.n_entries + kBlock - 1) / kBlock;
  const size_t padded = n_blocks * kBlock;

  alignas(64) float qs[kMaxQueries * 256];
  alignas(64) float acc[kMaxQueries * 256];
  alignas(64) float kt[256 * kBlock];
  int32_t qpos[kMaxQueries];

  int32_t max_pos = std::numeric_limits<int32_t>::min();
  for (size_t r = 0; r < n_rows; ++r) {
    const int32_t p = a.row_pos[a.row_begin + r];
    max_pos = std::max(max_pos, p);
    for (int j = 0; j < group; ++j) {
      const size_t qi = r * group + j;
      const float* src = a.q + (a.row_begin + r) * q_stride + static_cast<size_t>(a.kv_head * group + j) * hd;
      for (int d = 0; d < hd; ++d) qs[qi * hd + d] = static_cast<float>(static_cast<_Float16>(src[d]));
      qpos[qi] = p;
    }
  }
  scores.resize(nq * padded);
  std::vector<uint8_t> live(n_blocks, 0);

  // Pass 1: scaled scores of every visible entry (-inf where masked).
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t b0 = b * kBlock;
    const size_t bn = std::min(kBlock, a.n_entries - b0);
    int32_t min_pos = std::numeric_limits<int32_t>::max();
    for (size_t j = 0; j < bn; ++j) min_pos = std::min(min_pos, a.entry_pos[b0 + j]);
    if (min_pos > max_pos) {  // the whole block lies in every row's future
      for (size_t qi = 0; qi < nq; ++qi) std::fill_n(&scores[qi * padded + b0], kBlock, kNegInf);
      continue;
    }
    live[b] = 1;
    // K block transposed to [hd][kBlock] so the score loop runs along entries.
    const float* kb = a.K + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
    for (size_t j = 0; j < bn; ++j)
      for (int d = 0; d < hd; ++d) kt[d * kBlock + j] = kb[j * kv_stride + d];
    for (size_t j = bn; j < kBlock; ++j)
      for (int d = 0; d < hd; ++d) kt[d * kBlock + j] = 0.f;
    for (size_t qi = 0; qi < nq; ++qi) {
      float* s = &scores[qi * padded + b0];
      for (size_t j = 0; j < kBlock; ++j) s[j] = 0.f;
      const float* qv = qs + qi * hd;
      for (int d = 0; d < hd; ++d) {
        const float qd = qv[d];
        const float* kr = kt + d * kBlock;
        for (size_t j = 0; j < kBlock; ++j) s[j] += qd * kr[j];
      }
      for (size_t j = 0; j < kBlock; ++j) {
        const bool visible = j < bn && a.entry_pos[b0 + std::min(j, bn - 1)] <= qpos[qi];
        s[j] = visible ? s[j] * scale : kNegInf;
      }
    }
  }

  // Softmax per query, normalised, then rounded to f16 as llama.cpp's P.V input is.
  for (size_t qi = 0; qi < nq; ++qi) {
    float* s = &scores[qi * padded];
    float mx = kNegInf;
    for (size_t e = 0; e < padded; ++e) mx = std::max(mx, s[e]);
    if (mx == kNegInf) {
      std::fill_n(s, padded, 0.f);
      continue;
    }
    double sum = 0;
    for (size_t e = 0; e < padded; ++e) {
      const float p = s[e] == kNegInf ? 0.f : detail::exp_inline(s[e] - mx);
      s[e] = p;
      sum += p;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (size_t e = 0; e < padded; ++e) s[e] = static_cast<float>(static_cast<_Float16>(s[e] * inv));
  }

  // Pass 2: P.V over the live blocks.
  std::fill(acc, acc + nq * hd, 0.f);
  for (size_t b = 0; b < n_blocks; ++b) {
    if (!live[b]) continue;
    const size_t b0 = b * kBlock;
    const size_t bn = std::min(kBlock, a.n_entries - b0);
    const float* vb = a.V + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
    for (size_t qi = 0; qi < nq; ++qi) {
      const float* p = &scores[qi * padded + b0];
      float* o = acc + qi * hd;
      for (size_t j = 0; j < bn; ++j) {
        const float pj = p[j];
        if (pj == 0.f) continue;
        const float* vr = vb + j * kv_stride;
        for (int d = 0; d < hd; ++d) o[d] += pj * vr[d];
      }
    }
  }

  for (size_t r = 0; r < n_rows; ++r)
    for (int j = 0; j < group; ++j) {
      const size_t qi = r * group + j;
      float* dst = a.out + (a.row_begin + r) * q_stride + static_cast<size_t>(a.kv_head * group + j) * hd;
      for (int d = 0; d < hd; ++d) dst[d] = acc[qi * hd + d];
    }
}

}  // namespace

void attention(const AttentionShape& s, const float* q, const int32_t* row_pos, size_t n_rows,
               const float* K, const float* V, const int32_t* entry_pos, size_t n_entries,
               float* out, ThreadPool& pool) {
  if (s.head_dim > 256 || s.n_heads % s.n_kv_heads != 0)
    throw std::invalid_argument("attention: unsupported head shape");
  const size_t group = static_cast<size_t>(s.n_heads / s.n_kv_heads);
  const size_t rows_per_task = std::max<size_t>(1, kMaxQueries / group);
  const size_t row_tiles = (n_rows + rows_per_task - 1) / rows_per_task;
  const size_t n_tasks = row_tiles * static_cast<size_t>(s.n_kv_heads);
  pool.parallel_for(n_tasks, [&](size_t task, size_t) {
    // Later row tiles see more entries; hand them out first for better balance.
    const size_t tile = row_tiles - 1 - task / s.n_kv_heads;
    TileArgs a{&s, q, row_pos, tile * rows_per_task, std::min(n_rows, (tile + 1) * rows_per_task),
               static_cast<int>(task % s.n_kv_heads), K, V, entry_pos, n_entries, out};
    thread_local std::vector<float> scores;
    attend_tile(a, scores);
  });
}

void attention_probs(const AttentionShape& s, const float* q_row, int32_t row_pos, const float* K,
                     const int32_t* entry_pos, size_t n_entries, float* probs) {
  const int hd = s.head_dim;
  const int group = s.n_heads / s.n_kv_heads;
  const size_t kv_stride = static_cast<size_t>(s.n_kv_heads) * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int h = 0; h < s.n_heads; ++h) {
    float* p = probs + static_cast<size_t>(h) * n_entries;
    const float* qh = q_row + static_cast<size_t>(h) * hd;
    const int g = h / group;
    float mx = kNegInf;
    for (size_t e = 0; e < n_entries; ++e) {
      if (entry_pos[e] > row_pos) {
        p[e] = kNegInf;
        continue;
      }
      const float* k = K + e * kv_stride + static_cast<size_t>(g) * hd;
      float dot = 0.f;
      for (int d = 0; d < hd; ++d) dot += static_cast<float>(static_cast<_Float16>(qh[d])) * k[d];
      p[e] = dot * scale;
      mx = std::max(mx, p[e]);
    }
    double sum = 0;
    for (size_t e = 0; e < n_entries; ++e) {
      p[e] = p[e] == kNegInf ? 0.f : detail::exp_inline(p[e] - mx);
      sum += p[e];
    }
    const float inv = sum > 0 ? static_cast<float>(1.0 / sum) : 0.f;
    for (size_t e = 0; e < n_entries; ++e) p[e] *= inv;
  }
}

}  // namespace cf

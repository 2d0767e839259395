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
// entries, with an online (single pass) softmax. Per-task scratch lives on the stack.
CF_MULTIVERSION void attend_tile(const TileArgs& a) {
  const int hd = a.s->head_dim;
  const int group = a.s->n_heads / a.s->n_kv_heads;
  const size_t q_stride = static_cast<size_t>(a.s->n_heads) * hd;
  const size_t kv_stride = static_cast<size_t>(a.s->n_kv_heads) * hd;
  const size_t n_rows = a.row_end - a.row_begin;
  const size_t nq = n_rows * group;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  alignas(64) float qs[kMaxQueries * 256];
  alignas(64) float acc[kMaxQueries * 256];
  alignas(64) float kt[256 * kBlock];
  alignas(64) float sc[kMaxQueries * kBlock];
  float m[kMaxQueries], l[kMaxQueries];
  int32_t qpos[kMaxQueries];

  int32_t max_pos = std::numeric_limits<int32_t>::min();
  for (size_t r = 0; r < n_rows; ++r) {
    const int32_t p = a.row_pos[a.row_begin + r];
    max_pos = std::max(max_pos, p);
    for (int j = 0; j < group; ++j) {
      const size_t qi = r * group + j;
      const float* src = a.q + (a.row_begin + r) * q_stride + static_cast<size_t>(a.kv_head * group + j) * hd;
      for (int d = 0; d < hd; ++d) qs[qi * hd + d] = src[d] * scale;
      qpos[qi] = p;
      m[qi] = kNegInf;
      l[qi] = 0.f;
    }
  }
  std::fill(acc, acc + nq * hd, 0.f);

  for (size_t b0 = 0; b0 < a.n_entries; b0 += kBlock) {
    const size_t bn = std::min(kBlock, a.n_entries - b0);
    int32_t min_pos = std::numeric_limits<int32_t>::max();
    for (size_t j = 0; j < bn; ++j) min_pos = std::min(min_pos, a.entry_pos[b0 + j]);
    if (min_pos > max_pos) continue;  // the whole block lies in every row's future

    // K block transposed to [hd][kBlock] so the score loop runs along entries.
    const float* kb = a.K + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
    for (size_t j = 0; j < bn; ++j)
      for (int d = 0; d < hd; ++d) kt[d * kBlock + j] = kb[j * kv_stride + d];
    for (size_t j = bn; j < kBlock; ++j)
      for (int d = 0; d < hd; ++d) kt[d * kBlock + j] = 0.f;

    for (size_t qi = 0; qi < nq; ++qi) {
      float* s = sc + qi * kBlock;
      for (size_t j = 0; j < kBlock; ++j) s[j] = 0.f;
      const float* qv = qs + qi * hd;
      for (int d = 0; d < hd; ++d) {
        const float qd = qv[d];
        const float* kr = kt + d * kBlock;
        for (size_t j = 0; j < kBlock; ++j) s[j] += qd * kr[j];
      }
      float mx = kNegInf;
      for (size_t j = 0; j < kBlock; ++j) {
        const bool visible = j < bn && a.entry_pos[b0 + std::min(j, bn - 1)] <= qpos[qi];
        s[j] = visible ? s[j] : kNegInf;
        mx = std::max(mx, s[j]);
      }
      if (mx == kNegInf) continue;
      const float m_new = std::max(m[qi], mx);
      const float corr = m[qi] == kNegInf ? 0.f : detail::exp_inline(m[qi] - m_new);
      float sum = 0.f;
      for (size_t j = 0; j < kBlock; ++j) {
        const float p = s[j] == kNegInf ? 0.f : detail::exp_inline(s[j] - m_new);
        s[j] = p;
        sum += p;
      }
      l[qi] = l[qi] * corr + sum;
      m[qi] = m_new;
      float* o = acc + qi * hd;
      for (int d = 0; d < hd; ++d) o[d] *= corr;
      const float* vb = a.V + b0 * kv_stride + static_cast<size_t>(a.kv_head) * hd;
      for (size_t j = 0; j < bn; ++j) {
        const float p = s[j];
        if (p == 0.f) continue;
        const float* vr = vb + j * kv_stride;
        for (int d = 0; d < hd; ++d) o[d] += p * vr[d];
      }
    }
  }

  for (size_t r = 0; r < n_rows; ++r)
    for (int j = 0; j < group; ++j) {
      const size_t qi = r * group + j;
      float* dst = a.out + (a.row_begin + r) * q_stride + static_cast<size_t>(a.kv_head * group + j) * hd;
      const float inv = l[qi] > 0.f ? 1.0f / l[qi] : 0.f;
      for (int d = 0; d < hd; ++d) dst[d] = acc[qi * hd + d] * inv;
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
    attend_tile(a);
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
      for (int d = 0; d < hd; ++d) dot += qh[d] * k[d];
      p[e] = dot * scale;
      mx = std::max(mx, p[e]);
    }
    float sum = 0.f;
    for (size_t e = 0; e < n_entries; ++e) {
      p[e] = p[e] == kNegInf ? 0.f : detail::exp_inline(p[e] - mx);
      sum += p[e];
    }
    const float inv = sum > 0.f ? 1.0f / sum : 0.f;
    for (size_t e = 0; e < n_entries; ++e) p[e] *= inv;
  }
}

}  // namespace cf

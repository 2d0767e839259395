#include "runtime/attention.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "base/sanitizer.h"
#include "base/thread_pool.h"
#include "runtime/runtime_kernels.h"

namespace cf {

float AttentionShape::score_scale() const {
  return scale > 0.f ? 1.0f : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

AttentionShape attention_shape(const ModelHparams& h, int layer) {
  return AttentionShape{h.n_heads, h.n_kv_heads, h.head_dim, h.window_of(layer), h.attn_scale};
}

void attention(const AttentionShape& s, const float* q, const int32_t* row_pos, size_t n_rows,
               const uint16_t* K, const uint16_t* V, const int32_t* entry_pos, size_t n_entries,
               float* out, ThreadPool& pool) {
  if (s.head_dim > 256 || s.head_dim % 16 != 0 || s.n_heads % s.n_kv_heads != 0)
    throw std::invalid_argument("attention: unsupported head shape");
  // The ISA kernels are not instrumented in the sanitizer build (base/sanitizer.h).
  const size_t q_bytes = n_rows * static_cast<size_t>(s.n_heads) * s.head_dim * sizeof(float);
  const size_t kv_bytes = n_entries * static_cast<size_t>(s.n_kv_heads) * s.head_dim * sizeof(uint16_t);
  check_kernel_region("attention q", q, q_bytes);
  check_kernel_region("attention out", out, q_bytes);
  check_kernel_region("attention row_pos", row_pos, n_rows * sizeof(int32_t));
  check_kernel_region("attention K", K, kv_bytes);
  check_kernel_region("attention V", V, kv_bytes);
  check_kernel_region("attention entry_pos", entry_pos, n_entries * sizeof(int32_t));
  const rk::RuntimeKernels& k = rk::active();
  const size_t group = static_cast<size_t>(s.n_heads / s.n_kv_heads);
  const size_t rows_per_task = std::max<size_t>(1, (n_rows == 1 ? rk::kMaxQueries : k.batched_task_queries) / group);
  const size_t row_tiles = (n_rows + rows_per_task - 1) / rows_per_task;
  const size_t n_tasks = row_tiles * static_cast<size_t>(s.n_kv_heads);
  pool.parallel_for(n_tasks, [&](size_t task, size_t) {
    // Later row tiles see more entries; hand them out first for better balance.
    const size_t tile = row_tiles - 1 - task / s.n_kv_heads;
    rk::TileArgs a{&s, q, row_pos, tile * rows_per_task, std::min(n_rows, (tile + 1) * rows_per_task),
                   static_cast<int>(task % s.n_kv_heads), K, V, entry_pos, n_entries, out, n_rows == 1};
    thread_local std::vector<float> scores;
    k.attend_tile(a, scores);
  });
}

void attention_probs(const AttentionShape& s, const float* q_row, int32_t row_pos, const uint16_t* K,
                     const int32_t* entry_pos, size_t n_entries, float* probs) {
  check_kernel_region("attention_probs q_row", q_row, static_cast<size_t>(s.n_heads) * s.head_dim * sizeof(float));
  check_kernel_region("attention_probs K", K, n_entries * static_cast<size_t>(s.n_kv_heads) * s.head_dim * sizeof(uint16_t));
  check_kernel_region("attention_probs entry_pos", entry_pos, n_entries * sizeof(int32_t));
  check_kernel_region("attention_probs probs", probs, static_cast<size_t>(s.n_heads) * n_entries * sizeof(float));
  rk::active().attention_probs_row(s, q_row, row_pos, K, entry_pos, n_entries, probs);
}

}  // namespace cf

// Attention of query rows over one layer's cache entries, masked by position
// (entry visible iff entry_pos <= row_pos), grouped-query heads.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cf {

class ThreadPool;

struct AttentionShape {
  int n_heads;
  int n_kv_heads;
  int head_dim;
};

// out[r][h*hd..] = softmax(q_r,h . K_g^T / sqrt(hd), masked) V_g for each row r and head h.
// q: [n][n_heads*hd]; K, V: [n_entries][n_kv_heads*hd] as f16 bits (KvCache's rows).
// A row that sees no entry gets zeros.
void attention(const AttentionShape& s, const float* q, const int32_t* row_pos, size_t n_rows,
               const uint16_t* K, const uint16_t* V, const int32_t* entry_pos, size_t n_entries,
               float* out, ThreadPool& pool);

// Probabilities of one row: probs[h][e] (0 where masked), for hooks and selectors.
void attention_probs(const AttentionShape& s, const float* q_row, int32_t row_pos, const uint16_t* K,
                     const int32_t* entry_pos, size_t n_entries, float* probs);

}  // namespace cf

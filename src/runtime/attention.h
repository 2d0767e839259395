// Attention of query rows over one layer's cache entries, masked by position
// (entry visible iff entry_pos <= row_pos, and on a sliding-window layer also
// entry_pos > row_pos - window), grouped-query heads.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/arch.h"

namespace cf {

class ThreadPool;

struct AttentionShape {
  int n_heads;
  int n_kv_heads;
  int head_dim;
  int window = 0;     // > 0: a row sees only entries with row_pos - window < entry_pos (Gemma 3 local layers)
  // > 0: Q is multiplied by `scale` BEFORE it is rounded to f16 and scores are not scaled
  // again (Gemma's graph: ggml_scale on Q, then kq_scale 1; the order matters where q*scale
  // is an f16 subnormal). 0: scores are q.k / sqrt(head_dim) (llama's kq_scale).
  float scale = 0.f;

  float q_prescale() const { return scale > 0.f ? scale : 1.f; }
  float score_scale() const;
  // Whether an entry at entry_pos is visible to a row at row_pos.
  bool visible(int32_t entry_pos, int32_t row_pos) const {
    return entry_pos <= row_pos && (window <= 0 || entry_pos > row_pos - window);
  }
};

// The shape of one layer of a model (its window and scale included).
AttentionShape attention_shape(const ModelHparams& h, int layer);

// out[r][h*hd..] = softmax(q_r,h . K_g^T * scale, masked) V_g for each row r and head h.
// q: [n][n_heads*hd]; K, V: [n_entries][n_kv_heads*hd] as f16 bits (KvCache's rows).
// A row that sees no entry gets zeros.
void attention(const AttentionShape& s, const float* q, const int32_t* row_pos, size_t n_rows,
               const uint16_t* K, const uint16_t* V, const int32_t* entry_pos, size_t n_entries,
               float* out, ThreadPool& pool);

// Probabilities of one row: probs[h][e] (0 where masked), for hooks and selectors.
void attention_probs(const AttentionShape& s, const float* q_row, int32_t row_pos, const uint16_t* K,
                     const int32_t* entry_pos, size_t n_entries, float* probs);

}  // namespace cf

// The KV cache the forward pass reads and writes: per layer, one K and one V row per
// entry, plus the position of every entry. Entries need not be in position order; the
// attention mask is by position (an entry is visible to a row iff entry.pos <= row.pos).
//
// K and V hold f16-exact values (rounded on write, kept as float for the kernels), the
// precision of llama.cpp's default cache, so that both engines attend over the same
// numbers. Keys are stored AFTER RoPE (as llama.cpp does), so attention reads them directly.
// Moving entries to other positions rotates the stored keys by the position delta
// (RoPE(p + d) = RoPE(d) * RoPE(p)); values do not depend on position. The composition is
// exact in real arithmetic; in float it differs from direct computation by rounding only
// (tests/runtime/test_forward.cpp measures it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/arch.h"

namespace cf {

class KvCache {
 public:
  KvCache(const ModelHparams& h, size_t reserve_entries = 0);

  size_t size() const { return positions_.size(); }
  int n_layers() const { return n_layers_; }
  int kv_dim() const { return kv_dim_; }
  const ModelHparams& hparams() const { return h_; }

  float* k(int layer, size_t slot) { return &k_[layer][slot * kv_dim_]; }
  float* v(int layer, size_t slot) { return &v_[layer][slot * kv_dim_]; }
  const float* k(int layer, size_t slot) const { return &k_[layer][slot * kv_dim_]; }
  const float* v(int layer, size_t slot) const { return &v_[layer][slot * kv_dim_]; }
  int32_t position(size_t slot) const { return positions_[slot]; }
  const std::vector<int32_t>& positions() const { return positions_; }
  void set_position(size_t slot, int32_t pos) { positions_[slot] = pos; }

  // Adds n entries (K/V zero, positions given later by the writer); returns the first slot.
  size_t append(size_t n);
  void reserve(size_t n);
  void truncate(size_t n);  // keeps the first n entries
  void clear() { truncate(0); }

  // Moves entries [begin, end) by `delta` positions, re-rotating their keys in every layer.
  void shift(size_t begin, size_t end, int32_t delta);
  // Appends entries [begin, end) of `src` (same model shape) moved by `delta` positions;
  // returns the first new slot.
  size_t append_from(const KvCache& src, size_t begin, size_t end, int32_t delta);

  size_t bytes() const;  // memory held by K/V storage

 private:
  ModelHparams h_;
  int n_layers_;
  int kv_dim_;
  size_t capacity_ = 0;
  std::vector<std::vector<float>> k_, v_;
  std::vector<int32_t> positions_;
};

}  // namespace cf

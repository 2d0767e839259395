// The KV cache the forward pass reads and writes: per layer, one K and one V row per
// entry, plus the position of every entry. Entries need not be in position order; the
// attention mask is by position (an entry is visible to a row iff entry.pos <= row.pos,
// and on a sliding-window layer also entry.pos > row.pos - window).
//
// K and V are stored as IEEE f16 (uint16_t bit patterns), the precision of llama.cpp's
// default cache, so that both engines attend over the same numbers. Writers hand over
// floats, rounded to the nearest f16 (ties to even); the attention kernels convert rows
// back to float as they load them, which is exact, so storing f16 changes no result
// against keeping the f16-exact values as float, while halving the memory and the bytes
// decode reads per token. Rows of one layer are contiguous ([slot][kv_dim]).
// Keys are stored AFTER RoPE (as llama.cpp does), so attention reads them directly.
// Moving entries to other positions rotates the stored keys by the position delta (with
// each layer's RoPE base: Gemma 3's local and global layers differ)
// (RoPE(p + d) = RoPE(d) * RoPE(p)) in float and rounds them back to f16; values do not
// depend on position. The composition is exact in real arithmetic; in float it differs
// from direct computation by rounding only (tests/runtime/test_forward.cpp measures it).
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

  static constexpr size_t kValueBytes = sizeof(uint16_t);  // one f16 per K/V value

  // Raw f16 rows: entry `slot` of `layer`, the following entries right after it.
  uint16_t* k_f16(int layer, size_t slot) { return &k_[layer][slot * kv_dim_]; }
  uint16_t* v_f16(int layer, size_t slot) { return &v_[layer][slot * kv_dim_]; }
  const uint16_t* k_f16(int layer, size_t slot) const { return &k_[layer][slot * kv_dim_]; }
  const uint16_t* v_f16(int layer, size_t slot) const { return &v_[layer][slot * kv_dim_]; }
  // Entries [slot, slot + n) of one layer as floats (exact).
  void read_k(int layer, size_t slot, size_t n, float* out) const;
  void read_v(int layer, size_t slot, size_t n, float* out) const;
  // Stores entries [slot, slot + n) of one layer, rounding each value to the nearest f16.
  void write_k(int layer, size_t slot, size_t n, const float* in);
  void write_v(int layer, size_t slot, size_t n, const float* in);
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
  // K/V bytes of one entry of a model of this shape (what a token costs in a cache).
  static size_t bytes_per_entry(const ModelHparams& h) {
    return 2 * static_cast<size_t>(h.n_layers) * static_cast<size_t>(h.kv_dim()) * kValueBytes;
  }

 private:
  ModelHparams h_;
  int n_layers_;
  int kv_dim_;
  size_t capacity_ = 0;
  std::vector<std::vector<uint16_t>> k_, v_;  // per layer, f16 bits
  std::vector<int32_t> positions_;
};

}  // namespace cf

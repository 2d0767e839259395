#include "runtime/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "runtime/rope.h"
#include "runtime/vector_math.h"

namespace cf {

KvCache::KvCache(const ModelHparams& h, size_t reserve_entries)
    : h_(h), n_layers_(h.n_layers), kv_dim_(h.kv_dim()), k_(h.n_layers), v_(h.n_layers) {
  reserve(reserve_entries);
}

void KvCache::reserve(size_t n) {
  if (n <= capacity_) return;
  for (int l = 0; l < n_layers_; ++l) {
    k_[l].resize(n * kv_dim_);
    v_[l].resize(n * kv_dim_);
  }
  capacity_ = n;
  positions_.reserve(n);
}

size_t KvCache::append(size_t n) {
  const size_t first = size();
  if (n == 0) return first;  // &k_[l][first * kv_dim_] would index an empty vector
  if (first + n > capacity_) reserve(std::max(first + n, capacity_ * 2));
  positions_.resize(first + n, 0);
  for (int l = 0; l < n_layers_; ++l) {
    std::memset(&k_[l][first * kv_dim_], 0, n * kv_dim_ * kValueBytes);  // +0.0 in f16
    std::memset(&v_[l][first * kv_dim_], 0, n * kv_dim_ * kValueBytes);
  }
  return first;
}

void KvCache::truncate(size_t n) {
  if (n < size()) positions_.resize(n);
}

void KvCache::read_k(int layer, size_t slot, size_t n, float* out) const { f16_to_f32(k_f16(layer, slot), out, n * kv_dim_); }
void KvCache::read_v(int layer, size_t slot, size_t n, float* out) const { f16_to_f32(v_f16(layer, slot), out, n * kv_dim_); }
void KvCache::write_k(int layer, size_t slot, size_t n, const float* in) { f32_to_f16(in, k_f16(layer, slot), n * kv_dim_); }
void KvCache::write_v(int layer, size_t slot, size_t n, const float* in) { f32_to_f16(in, v_f16(layer, slot), n * kv_dim_); }

void KvCache::shift(size_t begin, size_t end, int32_t delta) {
  if (begin > end || end > size()) throw std::out_of_range("KvCache::shift: bad entry range");
  if (delta == 0) return;
  std::vector<float> row(kv_dim_);
  for (size_t s = begin; s < end; ++s) {
    positions_[s] += delta;
    for (int l = 0; l < n_layers_; ++l) {
      read_k(l, s, 1, row.data());
      rope_rotate(row.data(), h_.n_kv_heads, h_.head_dim, delta, h_.rope_base_of(l), h_.rope_style, h_.rope_factors());
      write_k(l, s, 1, row.data());
    }
  }
}

size_t KvCache::append_from(const KvCache& src, size_t begin, size_t end, int32_t delta) {
  if (src.kv_dim_ != kv_dim_ || src.n_layers_ != n_layers_)
    throw std::invalid_argument("KvCache::append_from: caches of different model shapes");
  if (begin > end || end > src.size()) throw std::out_of_range("KvCache::append_from: bad entry range");
  const size_t n = end - begin;
  if (n == 0) return size();  // nothing to copy (and no row to take an address of)
  const size_t first = append(n);
  for (int l = 0; l < n_layers_; ++l) {
    std::memcpy(k_f16(l, first), src.k_f16(l, begin), n * kv_dim_ * kValueBytes);
    std::memcpy(v_f16(l, first), src.v_f16(l, begin), n * kv_dim_ * kValueBytes);
  }
  for (size_t i = 0; i < n; ++i) positions_[first + i] = src.positions_[begin + i];
  shift(first, first + n, delta);
  return first;
}

size_t KvCache::bytes() const { return 2 * static_cast<size_t>(n_layers_) * capacity_ * kv_dim_ * kValueBytes; }

}  // namespace cf

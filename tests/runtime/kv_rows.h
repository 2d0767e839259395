// A KvCache's K or V entries as floats, for tests that compare caches value by value
// (the cache stores f16; reading is exact).
#pragma once
#include <cstddef>
#include <vector>

#include "runtime/kv_cache.h"

namespace cf::test {

inline std::vector<float> k_rows(const KvCache& c, int layer, size_t slot, size_t n = 1) {
  std::vector<float> out(n * c.kv_dim());
  c.read_k(layer, slot, n, out.data());
  return out;
}

inline std::vector<float> v_rows(const KvCache& c, int layer, size_t slot, size_t n = 1) {
  std::vector<float> out(n * c.kv_dim());
  c.read_v(layer, slot, n, out.data());
  return out;
}

}  // namespace cf::test

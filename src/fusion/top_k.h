// Global top-k of per-slot scores (ties: lower slot first), returned in ascending slot order.
#pragma once
#include <algorithm>
#include <numeric>
#include <vector>

namespace cf {

inline std::vector<size_t> top_k_slots(const std::vector<double>& score, size_t first_slot, size_t k) {
  std::vector<size_t> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](size_t a, size_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
  idx.resize(k);
  for (auto& i : idx) i += first_slot;
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace cf

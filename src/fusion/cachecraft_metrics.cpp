#include "fusion/cachecraft_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace cf::cachecraft {
namespace {
// Old-prefix chunks that survive in the new prefix, in old order, each once.
std::vector<std::string> surviving(const std::vector<PrefixSegment>& old_prefix,
                                   const std::unordered_map<std::string, size_t>& new_rank) {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  for (const auto& s : old_prefix)
    if (new_rank.count(s.id) && seen.insert(s.id).second) out.push_back(s.id);
  return out;
}

std::unordered_map<std::string, size_t> first_index(const std::vector<std::string>& ids) {
  std::unordered_map<std::string, size_t> at;
  for (size_t i = 0; i < ids.size(); ++i) at.emplace(ids[i], i);
  return at;
}
}  // namespace

double prefix_overlap_beta(const std::vector<PrefixSegment>& old_prefix, const std::vector<std::string>& new_prefix) {
  const std::unordered_set<std::string> present(new_prefix.begin(), new_prefix.end());
  double kept = 0, total = 0;
  for (const auto& s : old_prefix) {
    total += s.inter;
    if (present.count(s.id)) kept += s.inter;
  }
  return total > 0 ? kept / total : 0.0;
}

double order_penalty_gamma(const std::vector<PrefixSegment>& old_prefix, const std::vector<std::string>& new_prefix) {
  const auto new_rank = first_index(new_prefix);
  const std::vector<std::string> common = surviving(old_prefix, new_rank);
  const size_t m = common.size();
  if (m < 2) return 0.0;
  size_t discordant = 0;
  for (size_t a = 0; a < m; ++a)
    for (size_t b = a + 1; b < m; ++b)
      if (new_rank.at(common[a]) > new_rank.at(common[b])) ++discordant;
  return static_cast<double>(discordant) / (static_cast<double>(m) * static_cast<double>(m - 1) / 2.0);
}

double contextualization_a(const std::vector<PrefixSegment>& old_prefix, size_t n_tokens) {
  if (n_tokens == 0) return 0.0;
  double a = 0;
  for (const auto& s : old_prefix)
    if (s.n_tokens) a += s.inter / (static_cast<double>(n_tokens) * static_cast<double>(s.n_tokens));
  return a;
}

double contextualization_b(double intra, size_t n_tokens) {
  return n_tokens ? intra / (static_cast<double>(n_tokens) * static_cast<double>(n_tokens)) : 0.0;
}

double cache_context_impact(double a_bar, double b_bar) {
  if (a_bar <= 0) return 0.5;
  if (b_bar <= 0) return 1.0;
  return 1.0 / (1.0 + std::exp(-a_bar / b_bar));
}

double cache_fix_overhead(double alpha, double cci, double beta_prime) {
  return std::clamp(alpha * reuse_penalty(cci, beta_prime), 0.0, 1.0);
}

std::vector<size_t> cfo_token_counts(double alpha, const std::vector<double>& penalty,
                                     const std::vector<size_t>& chunk_tokens) {
  std::vector<size_t> n(penalty.size());
  for (size_t i = 0; i < n.size(); ++i) {
    const double cfo = std::clamp(alpha * penalty[i], 0.0, 1.0);
    // The 1e-9 keeps an exact product (0.25 * 8) from rounding up to one token more.
    n[i] = std::min(chunk_tokens[i], static_cast<size_t>(std::ceil(cfo * static_cast<double>(chunk_tokens[i]) - 1e-9)));
  }
  return n;
}

namespace {
// Largest-remainder rounding of real quotas (each <= its cap) to integers summing to `total`.
std::vector<size_t> round_quotas(const std::vector<double>& quota, const std::vector<size_t>& cap, size_t total) {
  std::vector<size_t> n(quota.size());
  size_t sum = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    n[i] = std::min(cap[i], static_cast<size_t>(std::floor(quota[i] + 1e-9)));
    sum += n[i];
  }
  std::vector<size_t> order(n.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return quota[a] - static_cast<double>(n[a]) > quota[b] - static_cast<double>(n[b]);
  });
  while (sum < total) {  // loops again only if a pass added nothing (all capped): guarded below
    size_t added = 0;
    for (size_t i : order) {
      if (sum == total) break;
      if (n[i] < cap[i]) ++n[i], ++sum, ++added;
    }
    if (added == 0) break;
  }
  return n;
}
}  // namespace

std::vector<size_t> allocate_budget(size_t budget, const std::vector<double>& penalty,
                                    const std::vector<size_t>& chunk_tokens, double* alpha_out) {
  const size_t k = penalty.size();
  const size_t all = std::accumulate(chunk_tokens.begin(), chunk_tokens.end(), size_t{0});
  budget = std::min(budget, all);
  std::vector<size_t> n(k, 0);
  if (alpha_out) *alpha_out = 0;
  if (budget == 0) return n;

  size_t positive_tokens = 0;
  double min_positive = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < k; ++i)
    if (penalty[i] > 0) positive_tokens += chunk_tokens[i], min_positive = std::min(min_positive, penalty[i]);

  if (positive_tokens <= budget) {
    // Every chunk that needs fixing is recomputed in full; the rest goes by size.
    if (alpha_out) *alpha_out = std::numeric_limits<double>::infinity();
    std::vector<double> quota(k, 0);
    std::vector<size_t> cap(k, 0);
    const size_t rest = budget - positive_tokens;
    const size_t zero_tokens = all - positive_tokens;
    for (size_t i = 0; i < k; ++i) {
      if (penalty[i] > 0) {
        n[i] = chunk_tokens[i];
      } else {
        cap[i] = chunk_tokens[i];
        quota[i] = zero_tokens ? static_cast<double>(rest) * static_cast<double>(chunk_tokens[i]) /
                                     static_cast<double>(zero_tokens)
                               : 0.0;
      }
    }
    const auto extra = round_quotas(quota, cap, rest);
    for (size_t i = 0; i < k; ++i) n[i] += extra[i];
    return n;
  }

  // Bisection on alpha: f(alpha) = sum_i min(|C_i|, alpha p_i |C_i|) is continuous and
  // nondecreasing, f(0) = 0 and f(1 / min p) = positive_tokens > budget.
  auto filled = [&](double alpha, std::vector<double>* quota) {
    double s = 0;
    for (size_t i = 0; i < k; ++i) {
      const double q = std::min(1.0, alpha * std::max(0.0, penalty[i])) * static_cast<double>(chunk_tokens[i]);
      if (quota) (*quota)[i] = q;
      s += q;
    }
    return s;
  };
  double lo = 0, hi = 1.0 / min_positive;
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    (filled(mid, nullptr) < static_cast<double>(budget) ? lo = mid : hi = mid);
  }
  std::vector<double> quota(k);
  filled(hi, &quota);
  if (alpha_out) *alpha_out = hi;
  std::vector<size_t> cap(chunk_tokens);
  for (size_t i = 0; i < k; ++i)
    if (!(penalty[i] > 0)) cap[i] = 0;
  return round_quotas(quota, cap, budget);
}

std::vector<uint32_t> rank_tokens(const std::vector<double>& score) {
  std::vector<uint32_t> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return score[a] > score[b]; });
  return idx;
}

size_t focused_chunk_count(std::vector<double> cumulative_attention) {
  const size_t k = cumulative_attention.size();
  if (k < 2) return k;
  std::sort(cumulative_attention.begin(), cumulative_attention.end(), std::greater<>());
  size_t best = k;
  double widest = 0;
  for (size_t i = 0; i + 1 < k; ++i) {
    const double gap = cumulative_attention[i] - cumulative_attention[i + 1];
    if (gap > widest) widest = gap, best = i + 1;
  }
  return best;
}

}  // namespace cf::cachecraft

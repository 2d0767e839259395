// Cache-Craft's reusability formulas (cache-craft-paper.txt §3.2-3.3, Eqs. 6-12, 14, and
// Algorithm 1), as pure functions so tests can pin them to hand-computed values. Digest
// part B (digest-craft-and-cache-craft.md) has the fixes applied here:
//  - one canonical direction: inter(prev=C_j, cur=C_i) = attention mass that C_i's query
//    tokens put on C_j's key tokens, averaged over heads and layers (B6.1);
//  - gamma = 0 when fewer than two old-prefix chunks survive (B6.3), beta = 0 when the old
//    prefix is empty or got no attention (B6.2: a PIC cache saw no prefix at all);
//  - CFO clamped to [0, 1] (B6.3); CCI lies in [0.5, 1) (B6.4), b = 0 handled;
//  - Algorithm 1 (focused chunks) read as "split at the largest normalized gap" (B2.4).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cf::cachecraft {

// One chunk of a variant's old prefix and the attention the variant's tokens paid to it.
struct PrefixSegment {
  std::string id;       // content id of the segment's tokens (its PIC key id)
  size_t n_tokens = 0;
  double inter = 0;     // inter(prev=this segment, cur=the cached chunk), head/layer mean
};

// Eq. 6: share of the old prefix's inter-attention that falls on chunks still present in
// the new prefix. Order-invariant. 0 when the old prefix is empty or unattended.
double prefix_overlap_beta(const std::vector<PrefixSegment>& old_prefix, const std::vector<std::string>& new_prefix);

// Eq. 7: normalized Kendall tau distance between the surviving old-prefix chunks in their
// old order and in their new order (discordant pairs / C(m,2)); 0 when m < 2.
double order_penalty_gamma(const std::vector<PrefixSegment>& old_prefix, const std::vector<std::string>& new_prefix);

// Eq. 8.
inline double adjusted_overlap(double beta, double gamma) { return beta * (1.0 - gamma); }

// Eq. 9-10 (inter and intra already averaged over layers): a = sum_j inter_j / (|C|·|C_j|).
double contextualization_a(const std::vector<PrefixSegment>& old_prefix, size_t n_tokens);
// b = intra / |C|^2.
double contextualization_b(double intra, size_t n_tokens);
// Eq. 11: CCI = sigmoid(a / b); 0.5 when a = 0 (incl. a = b = 0), 1 when b = 0 < a.
double cache_context_impact(double a_bar, double b_bar);

// Eq. 12 without alpha: the score variants are ranked by (§3.3) and CFO's per-chunk weight.
inline double reuse_penalty(double cci, double beta_prime) { return cci * (1.0 - beta_prime); }
// Eq. 12, clamped to [0, 1].
double cache_fix_overhead(double alpha, double cci, double beta_prime);

// Tokens to recompute per chunk at Cache-Craft's own budget: ceil(CFO_i · |C_i|) (§3.3).
std::vector<size_t> cfo_token_counts(double alpha, const std::vector<double>& penalty,
                                     const std::vector<size_t>& chunk_tokens);

// Fixed global budget: split `budget` tokens over chunks in proportion to CFO, i.e. find the
// alpha for which sum_i min(|C_i|, alpha·penalty_i·|C_i|) = budget (largest-remainder
// rounding). When the chunks with a positive penalty cannot absorb the budget, the rest is
// spread over the zero-penalty chunks in proportion to their size. Sums to exactly
// min(budget, sum |C_i|). `alpha_out` (optional) receives the alpha found (inf if saturated).
std::vector<size_t> allocate_budget(size_t budget, const std::vector<double>& penalty,
                                    const std::vector<size_t>& chunk_tokens, double* alpha_out = nullptr);

// Eq. 14's order: token indices by descending score, ties by lower index.
std::vector<uint32_t> rank_tokens(const std::vector<double>& score);

// Algorithm 1, one layer's decision: how many of the chunks (taken in descending order of
// cumulative question attention) are "focused". Reading: split at the largest gap between
// consecutive sorted scores (the literal line 8 picks the gap nearest 1/e; see digest
// B2.4). Returns k (all chunks) when every score is equal.
size_t focused_chunk_count(std::vector<double> cumulative_attention);

}  // namespace cf::cachecraft

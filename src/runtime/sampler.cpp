#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <unordered_set>
#include <vector>

namespace cf {

void SamplingParams::validate() const {
  auto bad = [](const std::string& m) { throw std::invalid_argument(m); };
  if (!std::isfinite(temperature) || temperature < 0) bad("temperature must be >= 0");
  if (!(top_p > 0) || top_p > 1) bad("top_p must be in (0, 1]");
  if (min_p < 0 || min_p > 1) bad("min_p must be in [0, 1]");
  if (!(repeat_penalty > 0)) bad("repeat_penalty must be > 0");
  if (repeat_last_n < 0) bad("repeat_last_n must be >= 0");
}

Sampler::Sampler(const SamplingParams& params) : p_(params), rng_(params.seed) { p_.validate(); }

TokenId argmax(const float* logits, size_t n) {
  return static_cast<TokenId>(std::max_element(logits, logits + n) - logits);
}

std::vector<double> log_softmax(std::span<const float> x) {
  double mx = -INFINITY;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  double sum = 0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<double>(x[i]) - lse;
  return out;
}

TokenId Sampler::sample(const float* logits, size_t vocab, std::span<const TokenId> history) {
  struct Cand {
    TokenId id;
    float logit;
  };
  std::vector<float> adjusted;
  const float* l = logits;
  if (p_.repeat_penalty != 1.0f && p_.repeat_last_n > 0 && !history.empty()) {
    // CTRL-style penalty as llama.cpp applies it: divide positive logits, multiply negative ones.
    adjusted.assign(logits, logits + vocab);
    const size_t from = history.size() > static_cast<size_t>(p_.repeat_last_n) ? history.size() - p_.repeat_last_n : 0;
    std::unordered_set<TokenId> seen(history.begin() + from, history.end());
    for (TokenId t : seen) {
      if (t < 0 || static_cast<size_t>(t) >= vocab) continue;
      float& x = adjusted[t];
      x = x > 0 ? x / p_.repeat_penalty : x * p_.repeat_penalty;
    }
    l = adjusted.data();
  }
  if (p_.temperature <= 0.0f) return argmax(l, vocab);

  std::vector<Cand> c(vocab);
  for (size_t i = 0; i < vocab; ++i) c[i] = {static_cast<TokenId>(i), l[i]};
  auto by_logit = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  size_t keep = vocab;
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < vocab) keep = p_.top_k;
  std::partial_sort(c.begin(), c.begin() + keep, c.end(), by_logit);
  c.resize(keep);

  // Probabilities of the survivors (before temperature, as llama.cpp's top-p/min-p see them).
  auto softmax = [&](float temp) {
    std::vector<double> p(c.size());
    const double mx = c.front().logit;
    double sum = 0;
    for (size_t i = 0; i < c.size(); ++i) sum += p[i] = std::exp((c[i].logit - mx) / temp);
    for (auto& x : p) x /= sum;
    return p;
  };
  if (p_.top_p < 1.0f) {
    auto p = softmax(1.0f);
    double cum = 0;
    size_t n = 0;
    while (n < c.size()) {
      cum += p[n++];
      if (cum >= p_.top_p) break;
    }
    c.resize(std::max<size_t>(1, n));
  }
  if (p_.min_p > 0.0f) {
    const float cutoff = c.front().logit + std::log(p_.min_p);
    size_t n = 1;
    while (n < c.size() && c[n].logit >= cutoff) ++n;
    c.resize(n);
  }
  auto p = softmax(p_.temperature);
  std::discrete_distribution<size_t> dist(p.begin(), p.end());
  return c[dist(rng_)].id;
}

}  // namespace cf

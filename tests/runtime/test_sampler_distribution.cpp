// Distribution tests of the sampler (issue 24): for temperature, top-k, top-p, min-p and the
// repetition penalty, logits where the filter changes the outcome; the observed frequencies
// are compared with a reference distribution written here with plain loops (not the
// sampler's code), and every token the filter must cut has to be drawn zero times.
//
// Bound: N draws; each kept token's frequency must lie within eps of its reference
// probability, eps from Hoeffding's inequality, P(|f - p| > eps) <= 2 exp(-2 N eps^2), with a
// union over the m tokens so that a correct sampler fails with probability < 1e-6 per test
// (and the draws are seeded, so in practice never). With N = 40000 and m <= 8, eps ~ 0.015:
// every filter checked below moves at least one probability by > 0.05.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/sampler.h"

namespace cf {
namespace {

constexpr int kDraws = 40000;

// Hoeffding + union bound over m tokens, total failure probability < 1e-6.
double hoeffding_eps(int n, size_t m) { return std::sqrt(std::log(2.0 * m / 1e-6) / (2.0 * n)); }

// Plain softmax of `logits / temp` restricted to `keep` (others 0).
std::vector<double> ref_softmax(const std::vector<double>& logits, const std::vector<bool>& keep, double temp) {
  std::vector<double> p(logits.size(), 0.0);
  double mx = -1e300;
  for (size_t i = 0; i < logits.size(); ++i)
    if (keep[i] && logits[i] > mx) mx = logits[i];
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (keep[i]) {
      p[i] = std::exp((logits[i] - mx) / temp);
      sum += p[i];
    }
  for (double& x : p) x /= sum;
  return p;
}

std::vector<double> to_double(const std::vector<float>& l) { return {l.begin(), l.end()}; }

void expect_distribution(const SamplingParams& params, const std::vector<float>& logits,
                         const std::vector<TokenId>& history, const std::vector<double>& want,
                         const std::string& what) {
  Sampler s(params);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) {
    const TokenId t = s.sample(logits.data(), logits.size(), history);
    ASSERT_GE(t, 0);
    ASSERT_LT(static_cast<size_t>(t), logits.size());
    ++counts[t];
  }
  const double eps = hoeffding_eps(kDraws, logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const double f = static_cast<double>(counts[i]) / kDraws;
    if (want[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << what << ": token " << i << " must be cut, drawn " << counts[i] << " times";
    } else {
      EXPECT_NEAR(f, want[i], eps) << what << ": token " << i << " (count " << counts[i] << ")";
    }
  }
}

SamplingParams params(float temp, int top_k, float top_p, float min_p, float rp = 1.0f, uint64_t seed = 7) {
  SamplingParams p;
  p.temperature = temp;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repeat_penalty = rp;
  p.repeat_last_n = 64;
  p.seed = seed;
  return p;
}

// log-probabilities 0.40, 0.30, 0.20, 0.06, 0.04 (in a shuffled order, so a filter that
// forgets to sort or keeps the first ids is caught too).
const std::vector<float> kFive = {std::log(0.20f), std::log(0.04f), std::log(0.40f), std::log(0.06f),
                                  std::log(0.30f)};

TEST(SamplerDistribution, TemperatureSharpensAndFlattens) {
  const std::vector<float> l = {0.0f, 0.5f, 1.0f, 1.5f};
  for (float temp : {0.5f, 1.0f, 2.0f}) {
    const auto want = ref_softmax(to_double(l), std::vector<bool>(l.size(), true), temp);
    expect_distribution(params(temp, 0, 1.0f, 0.0f), l, {}, want, "temperature " + std::to_string(temp));
  }
}

TEST(SamplerDistribution, TopKKeepsTheKMostLikely) {
  // top_k 2 keeps ids 2 (0.40) and 4 (0.30): 4/7, 3/7.
  const std::vector<double> want = {0, 0, 4.0 / 7, 0, 3.0 / 7};
  expect_distribution(params(1.0f, 2, 1.0f, 0.0f), kFive, {}, want, "top_k 2");
  // top_k 4 keeps all but id 1 (0.04).
  const std::vector<double> want4 = {0.20 / 0.96, 0, 0.40 / 0.96, 0.06 / 0.96, 0.30 / 0.96};
  expect_distribution(params(1.0f, 4, 1.0f, 0.0f), kFive, {}, want4, "top_k 4");
}

TEST(SamplerDistribution, TopPKeepsTheSmallestSetReachingP) {
  // Sorted: 0.40, 0.30, 0.20, 0.06, 0.04; cumulative 0.40, 0.70, 0.90: top_p 0.8 keeps three.
  const std::vector<double> want = {0.20 / 0.90, 0, 0.40 / 0.90, 0, 0.30 / 0.90};
  expect_distribution(params(1.0f, 0, 0.8f, 0.0f), kFive, {}, want, "top_p 0.8");
  // top_p 0.65 keeps two (0.40 < 0.65 <= 0.70).
  const std::vector<double> want2 = {0, 0, 4.0 / 7, 0, 3.0 / 7};
  expect_distribution(params(1.0f, 0, 0.65f, 0.0f), kFive, {}, want2, "top_p 0.65");
}

TEST(SamplerDistribution, TopPSeesProbabilitiesBeforeTemperature) {
  // As in llama.cpp, top-p/min-p cut on the untempered softmax; temperature then reshapes the
  // survivors. At temperature 2, top_p 0.8 still keeps the three ids above.
  std::vector<bool> keep = {true, false, true, false, true};
  const auto want = ref_softmax(to_double(kFive), keep, 2.0);
  expect_distribution(params(2.0f, 0, 0.8f, 0.0f), kFive, {}, want, "top_p 0.8 at temperature 2");
}

TEST(SamplerDistribution, MinPCutsBelowAFractionOfTheTop) {
  // min_p 0.6: cutoff 0.6 * 0.40 = 0.24 keeps 0.40, 0.30.
  const std::vector<double> want = {0, 0, 4.0 / 7, 0, 3.0 / 7};
  expect_distribution(params(1.0f, 0, 1.0f, 0.6f), kFive, {}, want, "min_p 0.6");
  // min_p 0.125: cutoff 0.05 keeps all but 0.04.
  const std::vector<double> want4 = {0.20 / 0.96, 0, 0.40 / 0.96, 0.06 / 0.96, 0.30 / 0.96};
  expect_distribution(params(1.0f, 0, 1.0f, 0.125f), kFive, {}, want4, "min_p 0.125");
}

TEST(SamplerDistribution, FiltersCompose) {
  // top_k 4 (drops 0.04), then top_p 0.95 on the renormalised four (0.4167, 0.3125, 0.2083,
  // 0.0625: cumulative 0.9375 < 0.95, so all four stay), then min_p 0.2 (cutoff 0.0833 drops
  // 0.0625): three remain.
  const std::vector<double> want = {0.20 / 0.90, 0, 0.40 / 0.90, 0, 0.30 / 0.90};
  expect_distribution(params(1.0f, 4, 0.95f, 0.2f), kFive, {}, want, "top_k 4 + top_p 0.95 + min_p 0.2");
}

TEST(SamplerDistribution, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  // ids 0 (logit 2) and 2 (logit -1) were seen; penalty 2: 2 -> 1, -1 -> -2. Id 3 was seen
  // only before the window (repeat_last_n 3) and keeps its logit.
  const std::vector<float> l = {2.0f, 1.0f, -1.0f, 0.5f};
  SamplingParams p = params(1.0f, 0, 1.0f, 0.0f, 2.0f);
  p.repeat_last_n = 3;
  const std::vector<TokenId> history = {3, 0, 2, 0};
  const std::vector<double> adjusted = {1.0, 1.0, -2.0, 0.5};
  const auto want = ref_softmax(adjusted, std::vector<bool>(l.size(), true), 1.0);
  expect_distribution(p, l, history, want, "repeat_penalty 2");
}

TEST(SamplerDistribution, BoundIsTightEnoughToSeeEachFilter) {
  // The bound used above must be smaller than the smallest change a filter makes here.
  EXPECT_LT(hoeffding_eps(kDraws, 5), 0.02);
}

}  // namespace
}  // namespace cf

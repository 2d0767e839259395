#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "runtime/sampler.h"

namespace cf {
namespace {

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  const std::vector<float> l = {0.1f, 3.0f, -2.0f, 3.0f};
  Sampler s(SamplingParams{0.0f});
  EXPECT_EQ(s.sample(l.data(), l.size(), {}), 1);
}

TEST(Sampler, TopKOneIsGreedyAtAnyTemperature) {
  const std::vector<float> l = {0.1f, 0.5f, 2.5f, 2.4f};
  SamplingParams p{1.5f, 1, 1.0f, 0.0f};
  Sampler s(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(l.data(), l.size(), {}), 2);
}

TEST(Sampler, SameSeedSameDraws) {
  std::vector<float> l(100);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(i % 7) * 0.3f;
  SamplingParams p{1.0f, 0, 1.0f, 0.0f, 1.0f, 64, 42};
  Sampler a(p), b(p);
  std::vector<TokenId> da, db;
  for (int i = 0; i < 30; ++i) {
    da.push_back(a.sample(l.data(), l.size(), {}));
    db.push_back(b.sample(l.data(), l.size(), {}));
  }
  EXPECT_EQ(da, db);
  EXPECT_GT(std::set<TokenId>(da.begin(), da.end()).size(), 1u) << "temperature 1 should not be deterministic";
}

TEST(Sampler, MinPAndTopPCutTheTail) {
  // p = 0.5, 0.3, 0.2: min_p 0.5 (cutoff 0.25) leaves ids 0 and 1; top_p 0.45 leaves id 0.
  // Without the filters id 2 would be drawn ~100 times in 500 (issue 24: the old logits had
  // p(0) = 0.9996, so the test passed with both filters off).
  const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler minp(SamplingParams{1.0f, 0, 1.0f, 0.5f, 1.0f, 64, 1});
  Sampler topp(SamplingParams{1.0f, 0, 0.45f, 0.0f, 1.0f, 64, 1});
  int minp_ones = 0;
  for (int i = 0; i < 500; ++i) {
    const TokenId a = minp.sample(l.data(), l.size(), {});
    EXPECT_NE(a, 2);
    minp_ones += a == 1;
    EXPECT_EQ(topp.sample(l.data(), l.size(), {}), 0);
  }
  EXPECT_GT(minp_ones, 0) << "min_p 0.5 must keep id 1";
}

TEST(Sampler, TemperatureFollowsTheDistribution) {
  const std::vector<float> l = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  Sampler s(SamplingParams{1.0f, 0, 1.0f, 0.0f, 1.0f, 64, 3});
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += s.sample(l.data(), l.size(), {}) == 1;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
}

TEST(Sampler, RepetitionPenaltyDemotesSeenTokens) {
  const std::vector<float> l = {2.0f, 1.9f};
  SamplingParams p{0.0f};
  p.repeat_penalty = 1.5f;
  Sampler s(p);
  const std::vector<TokenId> hist = {0};
  EXPECT_EQ(s.sample(l.data(), l.size(), hist), 1);  // 2.0 / 1.5 < 1.9
  EXPECT_EQ(s.sample(l.data(), l.size(), {}), 0);
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_THROW(Sampler(SamplingParams{-1.0f}), std::invalid_argument);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 40, 0.0f}), std::invalid_argument);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 40, 0.9f, 2.0f}), std::invalid_argument);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 40, 0.9f, 0.1f, 0.0f}), std::invalid_argument);
}

}  // namespace
}  // namespace cf

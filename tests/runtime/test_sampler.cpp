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
  // Token 0 has almost all the mass; min_p 0.5 leaves only it.
  const std::vector<float> l = {10.0f, 1.0f, 1.0f, 1.0f};
  Sampler minp(SamplingParams{1.0f, 0, 1.0f, 0.5f, 1.0f, 64, 1});
  Sampler topp(SamplingParams{1.0f, 0, 0.5f, 0.0f, 1.0f, 64, 1});
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(minp.sample(l.data(), l.size(), {}), 0);
    EXPECT_EQ(topp.sample(l.data(), l.size(), {}), 0);
  }
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

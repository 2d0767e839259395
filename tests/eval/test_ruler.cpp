// The RULER-style generator (determinism by seed, answers in the context, length near the
// target, chunk sizes), RULER's string match by hand-checked cases, and fixed-size
// re-chunking (the chunks cover the concatenated tokens exactly).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "../runtime/model_fixture.h"
#include "eval/bench_request.h"
#include "eval/metrics.h"
#include "eval/ruler.h"
#include "model/tokenizer.h"

namespace cf::eval {
namespace {

std::string context_of(const QaExample& ex) {
  std::string all;
  for (const auto& p : ex.passages) all += p.text + "\n";
  return all;
}

TEST(RulerMatch, HandCheckedCases) {
  // string_match_all: share of gold strings contained, case-insensitive.
  EXPECT_DOUBLE_EQ(string_match_all("The numbers are 123 and 456.", {"123", "456", "789", "000"}), 0.5);
  EXPECT_DOUBLE_EQ(string_match_all("VARS: abcde, FGHIJ", {"ABCDE", "FGHIJ"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("nothing", {"x1"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_all("anything", {}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_all("12345", {"1234"}), 1.0);  // containment, not token match
  // string_match_part: any gold string.
  EXPECT_DOUBLE_EQ(string_match_part("It is Tampa Bay.", {"Glendale", "tampa bay"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_part("It is Tampa.", {"Glendale", "Tampa Bay"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_part("x", {}), 0.0);
}

TEST(RulerName, ParsesAndRejects) {
  const RulerOptions o = parse_ruler_name("ruler:variable_tracking:8192");
  EXPECT_EQ(o.task, RulerTask::variable_tracking);
  EXPECT_EQ(o.context_tokens, 8192u);
  EXPECT_EQ(ruler_name(o), "ruler:variable_tracking:8192");
  for (const char* bad : {"ruler:niah_single", "ruler:nope:4096", "ruler:niah_single:12", "ruler:niah_single:4k",
                          "rulers:niah_single:4096"})
    EXPECT_THROW(parse_ruler_name(bad), std::invalid_argument) << bad;
  EXPECT_THROW(load_dataset("ruler:niah_single:4096"), std::runtime_error);  // needs a tokenizer
}

class RulerTasks : public ::testing::TestWithParam<RulerTask> {};

TEST_P(RulerTasks, SeededAnswerInContextNearTargetLength) {
  CF_REQUIRE_MODEL();
  const Model& m = test::shared_model();
  RulerOptions opt;
  opt.task = GetParam();
  opt.context_tokens = 2048;
  opt.examples = 3;
  opt.chunk_tokens = 384;
  opt.seed = 11;
  const Dataset a = generate_ruler(m.tokenizer(), opt), b = generate_ruler(m.tokenizer(), opt);
  opt.seed = 12;
  const Dataset c = generate_ruler(m.tokenizer(), opt);
  EXPECT_EQ(a.name, std::string("ruler:") + ruler_task_name(GetParam()) + ":2048");
  ASSERT_EQ(a.examples.size(), 3u);
  for (size_t i = 0; i < a.examples.size(); ++i) {
    const QaExample& ex = a.examples[i];
    EXPECT_EQ(context_of(ex), context_of(b.examples[i]));
    EXPECT_EQ(ex.answers, b.examples[i].answers);
    EXPECT_EQ(ex.question, b.examples[i].question);
    EXPECT_NE(context_of(ex), context_of(c.examples[i])) << "another seed, another example";
    const std::string ctx = context_of(ex);
    ASSERT_FALSE(ex.answers.empty());
    for (const auto& ans : ex.answers) EXPECT_NE(ctx.find(ans), std::string::npos) << ans;
    // Length as the bench tokenizes it: each passage + separator, on its own.
    const RagRequest req = build_example_request(m, ex, RagPromptOptions{});
    const double n = static_cast<double>(req.context_tokens());
    EXPECT_LE(n, 2048 * 1.01);
    EXPECT_GE(n, 2048 * 0.97);
    for (const auto& chunk : req.chunks) EXPECT_LE(chunk.size(), 384u + 2u);  // the separator may merge differently
    EXPECT_GE(req.chunks.size(), 6u);
  }
  switch (GetParam()) {
    case RulerTask::niah_single:
      EXPECT_EQ(a.examples[0].answers.size(), 1u);
      EXPECT_THAT(context_of(a.examples[0]), ::testing::HasSubstr("One of the special magic numbers for "));
      break;
    case RulerTask::niah_multikey: {
      EXPECT_EQ(a.examples[0].answers.size(), 1u);
      const std::string ctx = context_of(a.examples[0]);
      size_t needles = 0;
      for (size_t at = ctx.find("special magic numbers for"); at != std::string::npos;
           at = ctx.find("special magic numbers for", at + 1))
        ++needles;
      EXPECT_EQ(needles, kRulerNeedles);
      break;
    }
    case RulerTask::niah_multivalue:
      EXPECT_EQ(a.examples[0].answers.size(), kRulerNeedles);
      EXPECT_TRUE(a.examples[0].all_answers_required);
      break;
    case RulerTask::variable_tracking: {
      const auto& ex = a.examples[0];
      ASSERT_EQ(ex.answers.size(), kRulerChainHops + 1);
      EXPECT_TRUE(ex.all_answers_required);
      // The chain appears in order: VAR v1 = VAR v0 after VAR v0 = value.
      const std::string ctx = context_of(ex);
      for (size_t k = 1; k < ex.answers.size(); ++k) {
        const size_t def = ctx.find("VAR " + ex.answers[k] + " = VAR " + ex.answers[k - 1] + ".");
        ASSERT_NE(def, std::string::npos);
        EXPECT_LT(ctx.find("VAR " + ex.answers[k - 1] + " = "), def);
      }
      break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTasks, RulerTasks,
                         ::testing::Values(RulerTask::niah_single, RulerTask::niah_multikey, RulerTask::niah_multivalue,
                                           RulerTask::variable_tracking),
                         [](const auto& info) { return std::string(ruler_task_name(info.param)); });

TEST(Rechunk, SplitTokensSizes) {
  const std::vector<TokenId> t = {1, 2, 3, 4, 5, 6, 7};
  const auto c = split_tokens(t, 3);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0], (std::vector<TokenId>{1, 2, 3}));
  EXPECT_EQ(c[2], (std::vector<TokenId>{7}));
  EXPECT_EQ(split_tokens(t, 7).size(), 1u);
  EXPECT_TRUE(split_tokens({}, 4).empty());
  EXPECT_THROW(split_tokens(t, 0), std::invalid_argument);
}

TEST(Rechunk, ChunksCoverTheConcatenatedTokensExactly) {
  CF_REQUIRE_MODEL();
  const Model& m = test::shared_model();
  QaExample ex;
  ex.question = "Who wrote it?";
  ex.passages = {{"First", "Alpha beta gamma delta. A passage of some length, with commas, and words."},
                 {"", "An untitled second passage, a little longer than the first one was, to cross a boundary."},
                 {"Third", "Gamma."}};
  const RagPromptOptions opt;
  const RagRequest per_passage = build_example_request(m, ex, opt, 0);
  EXPECT_EQ(per_passage.chunks.size(), 3u);
  std::string all;
  for (const auto& p : ex.passages) all += passage_text(p, opt);
  const std::vector<TokenId> whole = m.tokenizer().encode(all, false, false);
  const RagRequest fixed = build_example_request(m, ex, opt, 16);
  EXPECT_EQ(fixed.system, per_passage.system);
  EXPECT_EQ(fixed.suffix, per_passage.suffix);
  ASSERT_EQ(fixed.chunks.size(), (whole.size() + 15) / 16);
  std::vector<TokenId> joined;
  for (size_t i = 0; i < fixed.chunks.size(); ++i) {
    if (i + 1 < fixed.chunks.size()) {
      EXPECT_EQ(fixed.chunks[i].size(), 16u);
    }
    joined.insert(joined.end(), fixed.chunks[i].begin(), fixed.chunks[i].end());
  }
  EXPECT_EQ(joined, whole);
  EXPECT_EQ(m.tokenizer().decode(joined), all);
}

}  // namespace
}  // namespace cf::eval

// Metric unit tests against hand-checked cases (LongBench/SQuAD normalisation, token F1,
// ROUGE-L edge cases, KL of first-token distributions).
#include <gtest/gtest.h>

#include <cmath>

#include "eval/metrics.h"

namespace cf::eval {
namespace {

TEST(Normalize, LowercasesStripsPunctuationArticlesAndWhitespace) {
  EXPECT_EQ(normalize_answer("The Cat!"), "cat");
  EXPECT_EQ(normalize_answer("  A  an  THE  "), "");
  EXPECT_EQ(normalize_answer("The theatre, an Anthem; a banana"), "theatre anthem banana");
  EXPECT_EQ(normalize_answer("U.S.A."), "usa");
  EXPECT_EQ(normalize_answer("rock 'n' roll"), "rock n roll");
  EXPECT_EQ(normalize_answer("Paris\n\tFrance\r\n"), "paris france");
  EXPECT_EQ(normalize_answer(""), "");
}

TEST(Normalize, PunctuationGoesBeforeArticlesAsInSquad) {
  // "the-end" loses its hyphen first and becomes one word, so no article is removed;
  // "the." loses its dot and then is an article.
  EXPECT_EQ(normalize_answer("the-end"), "theend");
  EXPECT_EQ(normalize_answer("in the."), "in");
  EXPECT_EQ(normalize_answer("(a) b"), "b");
  EXPECT_EQ(normalize_answer("an_apple"), "anapple");  // '_' is punctuation
}

TEST(Normalize, ArticlesOnlyAtWordBoundaries) {
  EXPECT_EQ(normalize_answer("another theory anathema"), "another theory anathema");
  EXPECT_EQ(normalize_answer("a1 the2"), "a1 the2");  // digits are word characters
}

TEST(Normalize, NonAsciiBytesAreKeptAndCountAsWordCharacters) {
  EXPECT_EQ(normalize_answer("Café au lait"), "café au lait");
  EXPECT_EQ(normalize_answer("théâtre"), "théâtre");
  EXPECT_EQ(normalized_tokens("São Paulo, Brazil"), (std::vector<std::string>{"são", "paulo", "brazil"}));
}

TEST(TokenF1, HandCheckedValues) {
  // 2 of 4 predicted tokens match both gold tokens: P = 1/2, R = 1, F1 = 2/3.
  EXPECT_NEAR(token_f1("the Eiffel Tower in Paris", "Eiffel Tower"), 2.0 / 3, 1e-12);
  // multiset overlap: a repeated token counts once per occurrence in the reference.
  EXPECT_NEAR(token_f1("paris paris", "Paris"), 2.0 / 3, 1e-12);
  EXPECT_NEAR(token_f1("Paris", "paris paris"), 2.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(token_f1("Eiffel Tower.", "the eiffel tower"), 1.0);
  EXPECT_DOUBLE_EQ(token_f1("London", "Paris"), 0.0);
  EXPECT_DOUBLE_EQ(token_f1("", "Paris"), 0.0);
  EXPECT_DOUBLE_EQ(token_f1("Paris", ""), 0.0);
  EXPECT_DOUBLE_EQ(token_f1("", ""), 0.0);        // LongBench: no overlap -> 0
  EXPECT_DOUBLE_EQ(token_f1("the", "a"), 0.0);    // both normalise to nothing
}

TEST(QaF1, MaxOverGoldAnswers) {
  // best gold: "Exeter College, Oxford" -> P = 1, R = 2/3, F1 = 0.8
  EXPECT_NEAR(qa_f1("Exeter College", {"Oxford", "Exeter College, Oxford"}), 0.8, 1e-12);
  EXPECT_DOUBLE_EQ(qa_f1("Oxford", {"Exeter College, Oxford", "oxford"}), 1.0);
  EXPECT_DOUBLE_EQ(qa_f1("Oxford", {}), 0.0);
}

TEST(ExactMatch, AfterNormalisation) {
  EXPECT_DOUBLE_EQ(exact_match("The Eiffel Tower.", {"eiffel tower"}), 1.0);
  EXPECT_DOUBLE_EQ(exact_match("Eiffel", {"eiffel tower"}), 0.0);
  EXPECT_DOUBLE_EQ(exact_match("eiffel tower", {"Louvre", "Eiffel  Tower"}), 1.0);
  EXPECT_DOUBLE_EQ(exact_match("", {"x"}), 0.0);
  EXPECT_DOUBLE_EQ(exact_match("", {}), 0.0);
}

TEST(RougeL, LongestCommonSubsequence) {
  // LCS "w y z" = 3 of 4 on both sides: P = R = 3/4.
  EXPECT_NEAR(rouge_l("w x y z", "w y z q"), 0.75, 1e-12);
  // Order matters (token F1 would be 1 here): LCS = 1, P = R = 1/4.
  EXPECT_NEAR(rouge_l("z y x w", "w x y z"), 0.25, 1e-12);
  EXPECT_NEAR(token_f1("z y x w", "w x y z"), 1.0, 1e-12);
  // "police killed the gunman" vs "the gunman was killed by police": normalised
  // [police killed gunman] vs [gunman was killed by police], LCS 1: P = 1/3, R = 1/5.
  EXPECT_NEAR(rouge_l("police killed the gunman", "the gunman was killed by police"), 0.25, 1e-12);
  // subsequence, not substring: [a1 c1] within [a1 b1 c1]: P = 1, R = 2/3.
  EXPECT_NEAR(rouge_l("a1 c1", "a1 b1 c1"), 0.8, 1e-12);
}

TEST(RougeL, EdgeCases) {
  EXPECT_DOUBLE_EQ(rouge_l("", "paris"), 0.0);
  EXPECT_DOUBLE_EQ(rouge_l("paris", ""), 0.0);
  EXPECT_DOUBLE_EQ(rouge_l("", ""), 0.0);
  EXPECT_DOUBLE_EQ(rouge_l("The END.", "end"), 1.0);
  EXPECT_DOUBLE_EQ(rouge_l("x", "y"), 0.0);
  EXPECT_DOUBLE_EQ(rouge_l("paris", std::vector<std::string>{}), 0.0);
  EXPECT_NEAR(rouge_l("w x", std::vector<std::string>{"q", "x w", "w x y"}), 0.8, 1e-12);
}

TEST(Fidelity, IdenticalAnswersScoreOneEvenWhenEmpty) {
  EXPECT_DOUBLE_EQ(fidelity_f1("Exeter College", "Exeter College"), 1.0);
  EXPECT_DOUBLE_EQ(fidelity_f1("", ""), 1.0);
  EXPECT_DOUBLE_EQ(fidelity_f1("The.", "a"), 1.0);  // both normalise to nothing
  EXPECT_DOUBLE_EQ(fidelity_f1("", "Paris"), 0.0);
  EXPECT_NEAR(fidelity_f1("Paris France", "Paris"), 2.0 / 3, 1e-12);
}

TEST(Kl, HandComputedTwoTokenCase) {
  // p = softmax(0, 0) = (1/2, 1/2); q = softmax(ln 3, 0) = (3/4, 1/4).
  // KL(p||q) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3).
  const std::vector<float> p{0.0f, 0.0f}, q{static_cast<float>(std::log(3.0)), 0.0f};
  EXPECT_NEAR(kl_divergence_from_logits(p, q), 0.5 * std::log(4.0 / 3.0), 1e-7);
  // Not symmetric: KL(q||p) = 3/4 ln(3/2) + 1/4 ln(1/2).
  EXPECT_NEAR(kl_divergence_from_logits(q, p), 0.75 * std::log(1.5) + 0.25 * std::log(0.5), 1e-7);
}

TEST(Kl, ZeroForEqualOrShiftedLogitsAndStableForLargeOnes) {
  const std::vector<float> a{1.5f, -2.0f, 0.25f, 7.0f};
  std::vector<float> shifted = a;
  for (float& v : shifted) v += 100.0f;
  EXPECT_NEAR(kl_divergence_from_logits(a, a), 0.0, 1e-15);
  EXPECT_NEAR(kl_divergence_from_logits(a, shifted), 0.0, 1e-12);
  const std::vector<float> big{1000.0f, 0.0f}, flat{0.0f, 0.0f};
  const double kl = kl_divergence_from_logits(big, flat);  // p = (1, e^-1000) -> ln 2
  EXPECT_TRUE(std::isfinite(kl));
  EXPECT_NEAR(kl, std::log(2.0), 1e-9);
  EXPECT_THROW(kl_divergence_from_logits(a, flat), std::invalid_argument);
  EXPECT_THROW(kl_divergence_from_logits(std::vector<float>{}, std::vector<float>{}), std::invalid_argument);
}

TEST(FirstToken, ArgmaxAgreementWithLowestIdOnTies) {
  EXPECT_TRUE(first_token_agrees(std::vector<float>{0, 3, 1}, std::vector<float>{-5, 0.5f, 0.4f}));
  EXPECT_FALSE(first_token_agrees(std::vector<float>{0, 3, 1}, std::vector<float>{0, 1, 3}));
  EXPECT_TRUE(first_token_agrees(std::vector<float>{2, 2}, std::vector<float>{5, 1}));  // ties -> id 0
  EXPECT_THROW(first_token_agrees(std::vector<float>{1}, std::vector<float>{1, 2}), std::invalid_argument);
}

}  // namespace
}  // namespace cf::eval

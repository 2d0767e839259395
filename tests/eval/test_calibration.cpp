// Calibrating and replaying the auto policy (issue 26, eval/calibration.h) on records made
// by hand, so every number of the report can be checked by arithmetic.
#include "eval/calibration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace cf::eval {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

json step(double ratio, double margin, bool identical, double ttft) {
  return {{"method", "prophet"}, {"ratio", ratio}, {"margin", margin}, {"entropy", 1.0}, {"top1", 5},
          {"identical", identical}, {"ttft_ms", ttft}};
}

json record(const std::string& id, std::vector<json> steps, double full_ttft, const std::string& fp = "ab12",
            size_t context_tokens = 100) {
  return {{"id", id}, {"dataset", "d"}, {"fingerprint", fp}, {"context_tokens", context_tokens},
          {"full", {{"ttft_ms", full_ttft}, {"answer", "x"}}}, {"steps", steps}};
}

TEST(CalibrationLadder, ParsesStepsAndNamesBadOnes) {
  const auto l = parse_ladder("prophet:0.05, cacheblend:0.3");
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].method, "prophet");
  EXPECT_DOUBLE_EQ(l[0].ratio, 0.05);
  EXPECT_EQ(l[1].method, "cacheblend");  // spaces around a step are dropped
}

TEST(CalibrationLadder, BadStepsAreNamed) {
  auto msg = [](const std::string& text) {
    try {
      parse_ladder(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(msg("full:0.5"), HasSubstr("unknown method 'full'"));
  EXPECT_THAT(msg("prophet"), HasSubstr("expected <method>:<ratio>"));
  EXPECT_THAT(msg("prophet:2"), HasSubstr("the ratio must be in [0, 1]"));
  EXPECT_THAT(msg("prophet:half"), HasSubstr("the ratio is not a number"));
  EXPECT_THAT(msg("prophet:0.1x"), HasSubstr("the ratio is not a number"));
  EXPECT_THAT(msg(""), HasSubstr("no steps"));
  EXPECT_THAT(msg("reuse:0,epic:0.05,epic:0.1,epic:0.15,epic:0.2,epic:0.25,epic:0.3,epic:0.4,epic:0.5"),
              HasSubstr("at most 8 can be planned"));
}

TEST(CalibrationRecords, ABadLineIsNamed) {
  const std::string path = ::testing::TempDir() + "records_" + std::to_string(::getpid()) + ".jsonl";
  std::ofstream(path) << record("a", {step(0.1, 0.5, true, 10)}, 100).dump() << "\n{broken\n";
  try {
    read_records(path);
    FAIL() << "a broken line must be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(path + ":2: not a record"));
  }
  std::filesystem::remove(path);
}

// Runs of two ladders on the same requests join into one record per request with the union
// of their steps; a request whose runs disagree on full prefill's answer is refused.
TEST(CalibrationRecords, RunsOfTwoLaddersOnOneSplitJoin) {
  const std::string dir = ::testing::TempDir() + "join_" + std::to_string(::getpid()) + "/";
  std::filesystem::create_directories(dir);
  json epic = step(0.15, 0.9, true, 20);
  epic["method"] = "epic";
  std::ofstream(dir + "epic.jsonl") << record("a", {step(0.0, 0.2, false, 1), epic}, 100).dump() << "\n"
                                    << record("b", {step(0.0, 0.2, true, 1), epic}, 100).dump() << "\n";
  std::ofstream(dir + "prophet.jsonl") << record("b", {step(0.0, 0.7, false, 2), step(0.3, 0.5, true, 30)}, 100).dump() << "\n"
                                       << record("a", {step(0.0, 0.7, false, 2), step(0.3, 0.5, true, 30)}, 100).dump() << "\n";
  const auto joined = join_records({dir + "epic.jsonl", dir + "prophet.jsonl"});
  ASSERT_EQ(joined.size(), 2u);
  EXPECT_EQ(joined[0]["id"], "a");  // the first file's order
  ASSERT_EQ(joined[1]["steps"].size(), 3u);
  EXPECT_EQ(joined[1]["steps"][0]["margin"], 0.2);  // the ratio-0 step of both: the first file's
  EXPECT_EQ(joined[1]["steps"][1]["method"], "epic");
  EXPECT_EQ(joined[1]["steps"][2]["ratio"], 0.3);
  // Joined, the records fit a calibration of the whole ladder.
  EXPECT_EQ(fit_calibration(joined).steps.size(), 3u);

  json other = record("a", {step(0.3, 0.5, true, 30)}, 100);
  other["full"]["answer"] = "y";
  std::ofstream(dir + "other.jsonl") << other.dump() << "\n";
  try {
    join_records({dir + "epic.jsonl", dir + "other.jsonl"});
    FAIL() << "two runs of a request with different full prefill answers must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("record a has another full prefill answer"));
  }
  // The same example cut another way (the 20 x 512 setting: 20 chunks, 10,240 tokens) is another
  // request: kept apart, never joined, whatever its full prefill answered.
  json long_a = record("a", {step(0.0, 0.1, false, 5)}, 900, "ab12", 10240);
  long_a["chunks"] = 20;
  long_a["full"]["answer"] = "z";
  std::ofstream(dir + "long.jsonl") << long_a.dump() << "\n";
  const auto both = join_records({dir + "epic.jsonl", dir + "long.jsonl"});
  ASSERT_EQ(both.size(), 3u);
  EXPECT_EQ(both[2]["context_tokens"], 10240);
  EXPECT_EQ(both[2]["steps"].size(), 1u);
  std::filesystem::remove_all(dir);
}

// Records of a longer ladder serve a calibration of any of its sub-ladders: the steps are
// picked by (method, ratio) in the calibration's order; a record without one is named.
TEST(CalibrationRecords, StepsAreSelectedByTheLadderNotByPosition) {
  json epic = step(0.15, 0.9, true, 20);
  epic["method"] = "epic";
  const std::vector<json> records = {record("a", {step(0.05, 0.1, false, 10), epic, step(0.3, 0.5, true, 30)}, 100)};
  const auto picked = select_steps(records, parse_ladder("prophet:0.3,epic:0.15"));
  ASSERT_EQ(picked[0]["steps"].size(), 2u);
  EXPECT_EQ(picked[0]["steps"][0]["ttft_ms"], 30);
  EXPECT_EQ(picked[0]["steps"][1]["method"], "epic");
  EXPECT_EQ(picked[0]["id"], "a");
  try {
    select_steps(records, parse_ladder("epic:0.3"));
    FAIL() << "a missing step must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("record a has no step epic:0.3"));
  }

  // The replay selects the calibration's steps itself: a one-step calibration of the third
  // step, accepting everything, answers from it (30 ms, identical).
  autoq::AutoCalibration c;
  c.fingerprint = "ab12";
  c.steps = {{"prophet", 0.3, json::object(), {30.0, 0.0, 0.0}}};
  autoq::AutoPolicy accept_all;
  accept_all.quality = 0.5;
  accept_all.steps = {0};
  accept_all.threshold = 0.5;
  c.size_classes = {{0, 1, {accept_all}}};
  const json rep = evaluate_policy(records, c, {0.5});
  ASSERT_EQ(rep["fixed"].size(), 2u);
  EXPECT_DOUBLE_EQ(rep["fixed"][0]["mean_ttft_ms"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(rep["auto"][0]["mean_ttft_ms"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(rep["auto"][0]["share"].get<double>(), 1.0);
}

// Identical exactly when the margin is high: the fit separates the two, and the plan answers
// high targets with the step where its margin is high and the rest with full prefill.
TEST(CalibrationFit, LearnsWhichMarginsAnswerLikeFullPrefill) {
  std::vector<json> records;
  for (int i = 0; i < 200; ++i) {
    const double m = (i % 100) / 100.0;
    records.push_back(record(std::to_string(i), {step(0.1, m, m > 0.6, 10)}, 100));
  }
  const autoq::AutoCalibration c = fit_calibration(records, 0.01);
  ASSERT_EQ(c.steps.size(), 1u);
  EXPECT_EQ(c.fingerprint, "ab12");
  EXPECT_GT(c.predict(0, {.margin = 0.95, .entropy = 1.0, .top1 = 0}), 0.9);
  EXPECT_LT(c.predict(0, {.margin = 0.2, .entropy = 1.0, .top1 = 0}), 0.1);
  EXPECT_EQ(c.provenance["examples"], 200);
  // At 0.9: the step (10 ms against full prefill's 100) answers the high margins, a few wrong
  // at most; the calibration set's share reaches the target at well under full prefill's time.
  const autoq::AutoPolicy& p = c.policy_for(0.9, 100);
  EXPECT_EQ(p.steps, (std::vector<size_t>{0}));
  EXPECT_GE(p.observed_share, 0.9);
  EXPECT_GE(p.expected_share, 0.9);
  EXPECT_LT(p.ttft_share, 0.7);
  EXPECT_TRUE(c.policy_for(1.0, 100).steps.empty());

  records.push_back(record("other", {step(0.1, 0.5, true, 10)}, 100, "cd34"));
  EXPECT_THROW(fit_calibration(records), std::invalid_argument);
  records.back() = record("ladder", {step(0.3, 0.5, true, 10)}, 100);
  EXPECT_THROW(fit_calibration(records), std::invalid_argument);
}

// Short requests answer like full prefill from the step when its margin is high; long ones
// never do, and their step costs more. One plan for all would run the step on long requests
// too; a plan per size class runs it on short ones only, and says so in the replay.
TEST(CalibrationFit, PlansEachSizeClassOnItsOwnRecords) {
  std::vector<json> records;
  for (int i = 0; i < 100; ++i) {
    const double m = (i % 50) / 50.0;
    records.push_back(record(std::to_string(1000 + i), {step(0.1, m, m > 0.5, 10)}, 100, "ab12", 1000));
  }
  for (int i = 0; i < 20; ++i) {
    const double m = (i % 10) / 10.0;
    records.push_back(record(std::to_string(2000 + i), {step(0.1, m, false, 50)}, 500, "ab12", 6000));
  }
  const autoq::AutoCalibration one = fit_calibration(records, 0.01);
  ASSERT_EQ(one.size_classes.size(), 1u);
  const autoq::AutoCalibration two = fit_calibration(records, 0.01, {3000});
  ASSERT_EQ(two.size_classes.size(), 2u);
  EXPECT_EQ(two.size_classes[1].min_context_tokens, 3000u);
  EXPECT_EQ(two.size_classes[0].examples, 100u);
  EXPECT_EQ(two.size_classes[1].examples, 20u);
  // At 0.95 a long request may be answered wrongly once in 20: running the step on all 20 to
  // accept one (20 x 50 + 19 x 500 ms) costs more than full prefill for all.
  EXPECT_EQ(two.policy_for(0.95, 1000).steps, (std::vector<size_t>{0}));
  EXPECT_TRUE(two.policy_for(0.95, 6000).steps.empty());
  EXPECT_EQ(&two.policy_for(0.95, 2999), &two.policy_for(0.95, 0));
  EXPECT_EQ(autoq::AutoCalibration::parse(two.to_json(), "again").to_json()["size_classes"], two.to_json()["size_classes"]);

  // Replayed on the long requests alone: the per-size plan answers them all with full
  // prefill; the one-class plan, priced and thresholded on the short ones, accepts long
  // requests whose margin looks like a short request's identical one, and misses 0.95 there.
  const std::vector<json> long_only(records.begin() + 100, records.end());
  const json by_size = evaluate_policy(long_only, two, {0.95});
  const json shared = evaluate_policy(long_only, one, {0.95});
  EXPECT_DOUBLE_EQ(by_size["auto"][0]["mean_ttft_ms"].get<double>(), 500.0);
  EXPECT_DOUBLE_EQ(by_size["auto"][0]["share"].get<double>(), 1.0);
  EXPECT_LT(shared["auto"][0]["share"].get<double>(), 0.95);
  ASSERT_EQ(by_size["auto"][0]["policies_by_size"].size(), 2u);
  EXPECT_EQ(by_size["auto"][0]["policies_by_size"][1]["min_context_tokens"], 3000);

  try {
    fit_calibration(records, 0.01, {5000, 5500});
    FAIL() << "a class with too few records must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("the size class of 5000-5499 context tokens has 0 records; at least 10"));
  }
  EXPECT_THROW(fit_calibration(records, 0.01, {3000, 3000}), std::invalid_argument);
}

// Two steps; step 0 says p = 0.95 when its margin is 1 and p ~ 0 when it is 0 (weights below).
// The policy for targets up to 0.9 runs step 0 alone, accepting from 0.9; above 0.9, full
// prefill. Four requests, TTFT of step 0 = 10, step 1 = 30, full = 100.
TEST(CalibrationReplay, ReportsTheSharesTimesAndChoicesOfThePolicy) {
  autoq::AutoCalibration c;
  c.fingerprint = "ab12";
  const double logit95 = std::log(0.95 / 0.05);
  c.steps = {{"prophet", 0.05, json::object(), {-30.0, 30.0 + logit95, 0.0}},
             {"prophet", 0.3, json::object(), {-20.0, 0.0, 0.0}}};
  autoq::AutoPolicy step0;
  step0.quality = 0.9;
  step0.steps = {0};
  step0.threshold = 0.9;
  c.size_classes = {{0, 4, {step0}}};
  const std::vector<json> records = {
      record("a", {step(0.05, 1.0, true, 10), step(0.3, 0.0, true, 30)}, 100),   // step 0 answers, right
      record("b", {step(0.05, 1.0, false, 10), step(0.3, 0.0, true, 30)}, 100),  // step 0 answers, wrong
      record("c", {step(0.05, 0.0, true, 10), step(0.3, 0.0, true, 30)}, 100),   // escalated to full
      record("d", {step(0.05, 0.0, false, 10), step(0.3, 0.0, false, 30)}, 100),  // escalated to full
  };
  const json rep = evaluate_policy(records, c, {0.9, 0.99});
  ASSERT_EQ(rep["fixed"].size(), 3u);
  EXPECT_DOUBLE_EQ(rep["fixed"][0]["share"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(rep["fixed"][1]["share"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(rep["fixed"][2]["share"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(rep["fixed"][2]["mean_ttft_ms"].get<double>(), 100.0);

  const json& q90 = rep["auto"][0];
  EXPECT_DOUBLE_EQ(q90["share"].get<double>(), 0.75);  // a, c, d right; b wrong
  // a, b: 10 ms; c, d: 10 wasted + 100 (the policy does not run step 1).
  EXPECT_DOUBLE_EQ(q90["mean_ttft_ms"].get<double>(), (10 + 10 + 110 + 110) / 4.0);
  EXPECT_DOUBLE_EQ(q90["decision_ms"].get<double>(), 5.0);
  // a and b saved 100 - 10 each: 45 ms a request, of which the rejected steps cost 5.
  EXPECT_DOUBLE_EQ(q90["saved_ms"].get<double>(), 45.0);
  EXPECT_DOUBLE_EQ(q90["decision_share_of_saved"].get<double>(), 5.0 / 45.0);
  EXPECT_EQ(q90["chosen"]["full"], 2);
  EXPECT_FALSE(q90["meets_target"].get<bool>());  // 0.75 < 0.9
  EXPECT_TRUE(q90["interval_reaches_target"].get<bool>());  // 3 of 4: Wilson's upper end 0.95
  // The cheapest fixed policy with a share of at least 0.75: step 1 (30 ms).
  EXPECT_DOUBLE_EQ(q90["cheapest_fixed"]["ratio"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(q90["speedup_vs_cheapest_fixed"].get<double>(), 30.0 / 60.0);

  EXPECT_EQ(q90["policy"]["threshold"], 0.9);
  const json& q99 = rep["auto"][1];  // no policy serves 0.99: full prefill for all
  EXPECT_DOUBLE_EQ(q99["share"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(q99["mean_ttft_ms"].get<double>(), 100.0);
  EXPECT_TRUE(q99["meets_target"].get<bool>());
  EXPECT_TRUE(q99["decision_share_of_saved"].is_null());  // no step answered: nothing saved

  // Reliability: step 0 put a, b in the top bin (predicted 0.95, observed 0.5).
  const json& bins = rep["reliability"][0]["bins"];
  ASSERT_EQ(bins.size(), 2u);
  EXPECT_DOUBLE_EQ(bins[1]["observed"].get<double>(), 0.5);
  EXPECT_NEAR(bins[1]["predicted"].get<double>(), 0.95, 1e-9);

  // A perfect predictor on the same ladder: a 10; b 10 + 30 (step 1 identical); c 10; d 10 + 30
  // + 100. Paying only the cheapest identical step: 10, 30, 10, 100.
  EXPECT_DOUBLE_EQ(rep["perfect_predictor"]["ladder"]["mean_ttft_ms"].get<double>(), (10 + 40 + 10 + 140) / 4.0);
  EXPECT_DOUBLE_EQ(rep["perfect_predictor"]["clairvoyant"]["mean_ttft_ms"].get<double>(), (10 + 30 + 10 + 100) / 4.0);
  // Step 1 alone, perfectly predicted: 30 for a, b, c; 30 + 100 for d.
  EXPECT_DOUBLE_EQ(rep["perfect_predictor"]["single_step"][1]["mean_ttft_ms"].get<double>(), (30 * 3 + 130) / 4.0);

  std::vector<json> other = records;
  other[0]["fingerprint"] = "ff00";
  EXPECT_THROW(evaluate_policy(other, c, {0.9}), std::invalid_argument);
  // Records of other RAG prompt words than the calibration's are refused, naming both.
  c.provenance["prompt_layout"] = "11aa";
  EXPECT_NO_THROW(evaluate_policy(records, c, {0.9}));  // records without a layout predate it
  other = records;
  other[2]["prompt_layout"] = "22bb";
  try {
    evaluate_policy(other, c, {0.9});
    FAIL() << "records of another prompt layout must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("record c was made with other RAG prompt words (layout 22bb) than the calibration's (11aa)"));
  }
  EXPECT_THROW(evaluate_policy(records, c, {1.5}), std::invalid_argument);
}

// Cross-validation is fitting and replaying fold by fold: its one report equals the five
// folds' own replays pooled, each by a calibration fitted on the other folds plus the records
// it is told only to fit on, whatever order the records come in. The records change halfway
// (identical from margin 0.3 in the first 20, from 0.7 in the last 30), so a calibration that
// had seen its own fold would plan otherwise.
TEST(CalibrationCrossValidation, ReplaysEachFoldWithACalibrationFittedWithoutIt) {
  std::vector<json> records, extra;
  auto id = [](std::string prefix, int i) { return prefix.append(std::to_string(i)); };  // GCC 12's -Wrestrict misfires on "a" + s
  for (int i = 0; i < 50; ++i) {
    const double m = (i * 7 % 20) / 20.0;
    json r = record(id("r", i), {step(0.05, m, m > (i < 20 ? 0.3 : 0.7), 10), step(0.3, m, m > 0.2, 30)}, 100);
    r["index"] = i;
    records.push_back(r);
  }
  for (int i = 0; i < 12; ++i) {  // another dataset's long requests: fitted on, never replayed
    json r = record(id("long", i), {step(0.05, i / 12.0, i % 3 == 0, 80), step(0.3, 0.5, true, 200)}, 900,
                    "ab12", 6000);
    r["dataset"] = "other";
    r["index"] = i;
    extra.push_back(r);
  }
  const std::vector<double> targets = {0.6, 0.8, 0.9};
  CrossValidation cv;
  cv.folds = 5;
  cv.l2 = 0.1;
  cv.size_bounds = {3000};
  const json rep = cross_validate(records, extra, cv, targets);
  EXPECT_EQ(rep["examples"], 50);
  EXPECT_EQ(rep["cross_validation"]["folds"], 5);
  EXPECT_EQ(rep["cross_validation"]["fitted_also_on"], 12);
  ASSERT_EQ(rep["auto"][0]["fold_policies"].size(), 5u);
  EXPECT_EQ(rep["auto"][0]["fold_policies"][0].size(), 2u);  // both size classes in each fold's plan
  EXPECT_FALSE(rep["auto"][0].contains("policies_by_size"));

  bool folds_differ = false;
  for (size_t t = 0; t < targets.size(); ++t) {
    double share = 0, ttft = 0, decision = 0;
    json first_plan;
    for (int k = 0; k < 5; ++k) {
      std::vector<json> train(extra), fold;
      for (int i = 0; i < 50; ++i) (i / 10 == k ? fold : train).push_back(records[i]);
      const json one = evaluate_policy(fold, fit_calibration(train, cv.l2, cv.size_bounds), {targets[t]});
      share += one["auto"][0]["share"].get<double>() / 5;
      ttft += one["auto"][0]["mean_ttft_ms"].get<double>() / 5;
      decision += one["auto"][0]["decision_ms"].get<double>() / 5;
      EXPECT_EQ(one["auto"][0]["policies_by_size"], rep["auto"][t]["fold_policies"][k]) << "target " << targets[t] << ", fold " << k;
      if (k == 0) first_plan = one["auto"][0]["policies_by_size"];
      folds_differ = folds_differ || one["auto"][0]["policies_by_size"] != first_plan;
    }
    EXPECT_NEAR(rep["auto"][t]["share"].get<double>(), share, 1e-12) << "target " << targets[t];
    EXPECT_NEAR(rep["auto"][t]["mean_ttft_ms"].get<double>(), ttft, 1e-9) << "target " << targets[t];
    EXPECT_NEAR(rep["auto"][t]["decision_ms"].get<double>(), decision, 1e-9) << "target " << targets[t];
  }
  EXPECT_TRUE(folds_differ);  // else the check above could not tell the folds' fits apart

  std::vector<json> shuffled(records.rbegin(), records.rend());
  EXPECT_EQ(cross_validate(shuffled, extra, cv, targets).dump(), rep.dump());

  // A request both replayed and fitted on in every fold would be scored by calibrations that saw it.
  std::vector<json> overlapping(extra);
  overlapping.push_back(records[3]);
  try {
    cross_validate(records, overlapping, cv, targets);
    FAIL() << "a record in both sets must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("record r3 is both to be replayed and only fitted on"));
  }
  // The same example cut another way is another request: fitting on it is no leak.
  json recut = records[3];
  recut["context_tokens"] = 6000;
  overlapping.back() = recut;
  EXPECT_NO_THROW(cross_validate(records, overlapping, cv, targets));
  cv.folds = 1;
  EXPECT_THROW(cross_validate(records, extra, cv, targets), std::invalid_argument);
  cv.folds = 51;
  EXPECT_THROW(cross_validate(records, extra, cv, targets), std::invalid_argument);
  // A sub-ladder: the fits and the replay see step 1 only.
  cv.folds = 5;
  cv.ladder = {{"prophet", 0.3}};
  const json sub = cross_validate(records, extra, cv, targets);
  ASSERT_EQ(sub["fixed"].size(), 2u);
  EXPECT_DOUBLE_EQ(sub["fixed"][0]["ratio"].get<double>(), 0.3);
}

}  // namespace
}  // namespace cf::eval

// The auto policy (issue 26, fusion/auto_quality.h): its signals, its predictor fit, its
// calibration files (another model's is refused), and its escalation over the real executor.
#include "fusion/auto_quality.h"
#include "fusion/bundled_files.h"
#include "base/clock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>

#include "../runtime/model_fixture.h"
#include "fusion_invariants.h"

namespace cf {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

TEST(AutoSignals, MarginAndEntropyOfAKnownDistribution) {
  const std::vector<float> logits = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  const autoq::FirstTokenSignals s = autoq::first_token_signals(logits);
  EXPECT_EQ(s.top1, 1);
  EXPECT_NEAR(s.margin, 0.2, 1e-6);
  EXPECT_NEAR(s.entropy, -(0.2 * std::log(0.2) + 0.5 * std::log(0.5) + 0.3 * std::log(0.3)), 1e-6);
  // Shifting every logit changes nothing (softmax).
  const std::vector<float> shifted = {logits[0] + 40, logits[1] + 40, logits[2] + 40};
  EXPECT_NEAR(autoq::first_token_signals(shifted).margin, s.margin, 1e-6);
  EXPECT_THROW(autoq::first_token_signals(std::vector<float>{}), std::invalid_argument);
}

// Labels drawn from a known logistic model: the fit recovers its weights closely, and its
// probabilities are calibrated (mean prediction equals the observed rate).
TEST(AutoFit, RecoversAKnownLogisticModel) {
  const std::vector<double> truth = {-1.0, 4.0, -0.8};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> margin(0, 1), entropy(0, 4), u(0, 1);
  std::vector<std::vector<double>> x;
  std::vector<int> y;
  for (int i = 0; i < 20000; ++i) {
    x.push_back({margin(rng), entropy(rng)});
    y.push_back(u(rng) < autoq::logistic(truth, x.back()) ? 1 : 0);
  }
  const std::vector<double> w = autoq::fit_logistic(x, y, 0.0);
  ASSERT_EQ(w.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(w[i], truth[i], 0.3) << i;  // ~3 standard errors at n = 20000
  double mean_p = 0, mean_y = 0;
  for (size_t n = 0; n < x.size(); ++n) {
    mean_p += autoq::logistic(w, x[n]);
    mean_y += y[n];
  }
  EXPECT_NEAR(mean_p / x.size(), mean_y / x.size(), 1e-3);
  // Separable labels and labels all equal stay finite (the penalty and the step clamp).
  std::vector<int> all_one(x.size(), 1);
  for (double v : autoq::fit_logistic(x, all_one, 1.0)) EXPECT_TRUE(std::isfinite(v));
  EXPECT_THROW(autoq::fit_logistic({{1.0}}, {1, 0}), std::invalid_argument);
}

// Two prophet steps; step 0 predicts sigmoid(intercept0) for every request, step 1 ~0. One
// policy, for targets up to 0.9: run both, accept from p >= threshold.
json calibration_json(const std::string& fingerprint, double intercept0, double threshold = 0.9) {
  return {{"format", "chunkfuse.auto.calibration/2"},  // one plan for every size (files of before size classes)
          {"fingerprint", fingerprint},
          {"steps",
           {{{"method", "prophet"}, {"ratio", 0.05}, {"weights", {intercept0, 0.0, 0.0}}},
            {{"method", "prophet"}, {"ratio", 0.3}, {"weights", {-20.0, 0.0, 0.0}}}}},
          {"policies", {{{"quality", 0.9}, {"steps", {0, 1}}, {"threshold", threshold}, {"expected_share", 0.92},
                         {"observed_share", 0.9}, {"ttft_share", 0.4}}}}};
}

TEST(AutoCalibrationFile, ParsesWritesAndRefusesAnotherModel) {
  const json j = calibration_json("00112233aabbccdd", 3.0);
  const autoq::AutoCalibration c = autoq::AutoCalibration::parse(j, "test");
  ASSERT_EQ(c.steps.size(), 2u);
  EXPECT_NEAR(c.predict(0, {}), 1 / (1 + std::exp(-3.0)), 1e-12);
  EXPECT_EQ(autoq::AutoCalibration::parse(c.to_json(), "again").to_json()["steps"], c.to_json()["steps"]);
  // Written as /3: the /2 file's policies are its one size class, from 0 tokens.
  ASSERT_EQ(c.size_classes.size(), 1u);
  EXPECT_EQ(c.to_json()["format"], autoq::kCalibrationFormat);
  EXPECT_EQ(c.to_json()["size_classes"][0]["min_context_tokens"], 0);
  EXPECT_EQ(autoq::AutoCalibration::parse(c.to_json(), "again").to_json()["size_classes"], c.to_json()["size_classes"]);

  const std::string path = ::testing::TempDir() + "auto_" + std::to_string(::getpid()) + ".auto.json";
  std::ofstream(path) << j.dump();
  EXPECT_EQ(autoq::load_calibration_file(path, "00112233aabbccdd").steps.size(), 2u);
  try {
    autoq::load_calibration_file(path, "ffffffffffffffff");
    FAIL() << "another model's calibration must be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("a calibration for model 00112233aabbccdd, not for this model (ffffffffffffffff)"));
  }
  std::filesystem::remove(path);

  auto bad = [&](json v, const std::string& what) {
    try {
      autoq::AutoCalibration::parse(v, "f.json");
      ADD_FAILURE() << "accepted: " << v.dump();
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(what)) << v.dump();
    }
  };
  const std::vector<std::pair<std::function<void(json&)>, std::string>> broken = {
      {[](json& v) { v["format"] = "other/1"; }, "format must be"},
      {[](json& v) { v["steps"] = json::array(); }, "\"steps\" must be a non-empty array"},
      {[](json& v) { v["steps"][0]["weights"] = {1.0}; }, "step weights must have 3 numbers"},
      {[](json& v) { v["steps"][0]["ratio"] = 2; }, "step ratio must be in [0, 1]"},
      {[](json& v) { v["steps"][1].erase("weights"); }, "a step needs method, ratio, weights"},
      {[](json& v) { v.erase("policies"); }, "\"policies\" must be an array"},
      {[](json& v) { v["policies"][0]["steps"] = {1, 0}; }, "policy steps must be ascending indices"},
      {[](json& v) { v["policies"][0]["steps"] = {2}; }, "policy steps must be ascending indices"},
      {[](json& v) { v["policies"][0]["threshold"] = 1.5; }, "policy threshold and shares must be in [0, 1]"},
      {[](json& v) { v["policies"].push_back(v["policies"][0]); }, "policies must be in ascending quality"},
      // A file of the per-request rule: refit, not misread.
      {[](json& v) { v["format"] = "chunkfuse.auto.calibration/1"; }, "chunkfuse calibrate --fit RECORDS"},
  };
  for (const auto& [edit, what] : broken) {
    json v = j;
    edit(v);
    bad(v, what);
  }
  const json j3 = c.to_json();
  const std::vector<std::pair<std::function<void(json&)>, std::string>> broken_classes = {
      {[](json& v) { v.erase("size_classes"); }, "\"size_classes\" must be a non-empty array"},
      {[](json& v) { v["size_classes"][0]["min_context_tokens"] = 5; }, "size classes must start at 0 context tokens"},
      {[](json& v) { v["size_classes"].push_back(v["size_classes"][0]); }, "size classes must start at 0 context tokens and ascend"},
      {[](json& v) { v["size_classes"][0].erase("min_context_tokens"); }, "a size class needs min_context_tokens"},
      {[](json& v) { v["size_classes"][0]["min_context_tokens"] = "0"; }, "a size class needs min_context_tokens"},
      {[](json& v) { v["size_classes"][0]["policies"][0]["steps"] = {2}; }, "policy steps must be ascending indices"},
      // Numbers that are not whole (found by fuzz/calibration_file_fuzz.cpp: 2.5e80 as a step
      // index converted to size_t with undefined behaviour) are refused.
      {[](json& v) { v["size_classes"][0]["policies"][0]["steps"] = {2.5e80}; }, "policy steps must be ascending indices"},
      {[](json& v) { v["size_classes"][0]["policies"][0]["steps"] = {-1}; }, "policy steps must be ascending indices"},
      {[](json& v) { v["size_classes"][0]["policies"][0]["steps"] = 0; }, "policy steps must be ascending indices"},
      {[](json& v) { v["size_classes"][0]["min_context_tokens"] = 1e300; }, "min_context_tokens (and examples) as whole numbers"},
      {[](json& v) { v["size_classes"][0]["examples"] = -4; }, "min_context_tokens (and examples) as whole numbers"},
  };
  for (const auto& [edit, what] : broken_classes) {
    json v = j3;
    edit(v);
    bad(v, what);
  }
  // No calibration of a fingerprint no one made; the shipped one of the unit tests' model is
  // compiled in (data/auto_calibrations, cf_bundle_json).
  EXPECT_FALSE(autoq::find_calibration("0000000000000000").has_value());
  const auto shipped = autoq::find_calibration("8fe8bd56461abfd6");
  ASSERT_TRUE(shipped.has_value());
  EXPECT_EQ(shipped->fingerprint, "8fe8bd56461abfd6");
  EXPECT_EQ(shipped->steps.size(), 3u);
  // Every shipped calibration parses (format /2 or /3) and plans some target with a fused step.
  size_t shipped_count = 0;
  for (const BundledFile* b = autoq::kBundledCalibrations; b->fingerprint; ++b, ++shipped_count) {
    const auto c = autoq::find_calibration(b->fingerprint);
    ASSERT_TRUE(c.has_value()) << b->file;
    EXPECT_FALSE(c->size_classes.front().policies.empty()) << b->file;
    EXPECT_FALSE(c->policy_for(0.5, 1000).steps.empty()) << b->file;
    EXPECT_TRUE(c->policy_for(1.0, 1000).steps.empty()) << b->file;
  }
  EXPECT_GE(shipped_count, 4u);  // SmolLM2, Gemma 3 270M, Qwen 0.5B, Qwen 1.5B
}

TEST(AutoDecisionRule, QualityBoundsAndPolicyLookup) {
  for (double q : {0.0, -0.1, 1.01, std::nan("")}) EXPECT_THROW(autoq::check_quality(q), std::invalid_argument) << q;
  EXPECT_NO_THROW(autoq::check_quality(1.0));
  json j = calibration_json("aa", 3.0, 0.8);
  j["policies"] = {{{"quality", 0.5}, {"steps", {0}}, {"threshold", 0.3}},
                   {{"quality", 0.9}, {"steps", {0, 1}}, {"threshold", 0.8}}};
  autoq::AutoCalibration c = autoq::AutoCalibration::parse(j, "t");
  // Each policy serves the targets above the previous one's and up to its own.
  EXPECT_DOUBLE_EQ(c.policy_for(0.2, 100).threshold, 0.3);
  EXPECT_DOUBLE_EQ(c.policy_for(0.5, 100).threshold, 0.3);
  EXPECT_DOUBLE_EQ(c.policy_for(0.51, 100).threshold, 0.8);
  EXPECT_EQ(c.policy_for(0.9, 100).steps, (std::vector<size_t>{0, 1}));
  // Above every stored policy: full prefill (no steps), which every target allows.
  EXPECT_TRUE(c.policy_for(0.91, 100).steps.empty());
  EXPECT_TRUE(c.policy_for(1.0, 100).steps.empty());
  EXPECT_TRUE(autoq::accepts(c.policy_for(0.9, 100), 0.8));
  EXPECT_FALSE(autoq::accepts(c.policy_for(0.9, 100), 0.79));
  // A second size class from 4000 tokens: requests from there take its policies, shorter ones
  // the first class's.
  autoq::AutoPolicy long_plan;
  long_plan.quality = 0.95;
  long_plan.steps = {1};
  long_plan.threshold = 0.4;
  c.size_classes.push_back({4000, 12, {long_plan}});
  EXPECT_DOUBLE_EQ(c.policy_for(0.9, 3999).threshold, 0.8);
  EXPECT_EQ(c.policy_for(0.9, 4000).steps, (std::vector<size_t>{1}));
  EXPECT_EQ(c.size_class(100000).min_context_tokens, 4000u);
  EXPECT_TRUE(c.policy_for(0.96, 4000).steps.empty());
}

// Ten requests, step 0 costs 10 ms and full prefill 100. Requests 0-5 predict 0.9 (5 of them
// identical), 6-9 predict 0.2 (none identical). Step 1 costs 90 and is never identical.
//   accept from 0.2: all answered, 5/10 identical, expected (6*0.9 + 4*0.2)/10 = 0.62, 100 ms of 1000
//   accept from 0.9: 6 answered, 5 + 4 escalated = 9/10, expected 0.94, 6*10 + 4*110 = 500 ms
// So: targets to 0.5 take the first, to 0.9 the second, above it full prefill; step 1 is
// never run (it only adds cost).
TEST(AutoPlan, PicksTheCheapestStepsAndThresholdPerTarget) {
  std::vector<autoq::PlanCase> cases;
  for (int i = 0; i < 10; ++i)
    cases.push_back({{i < 6 ? 0.9 : 0.2, 0.1}, {i < 5, false}, {10.0, 90.0}, 100.0});
  const std::vector<autoq::AutoPolicy> plan = autoq::plan_policies(cases);
  ASSERT_EQ(plan.size(), 3u);
  auto expect_policy = [](const autoq::AutoPolicy& p, double quality, double threshold, double observed, double expected,
                          double ttft) {
    EXPECT_DOUBLE_EQ(p.quality, quality);
    EXPECT_EQ(p.steps, (std::vector<size_t>{0})) << quality;
    EXPECT_DOUBLE_EQ(p.threshold, threshold);
    EXPECT_DOUBLE_EQ(p.observed_share, observed);
    EXPECT_NEAR(p.expected_share, expected, 1e-12);
    EXPECT_DOUBLE_EQ(p.ttft_share, ttft);
  };
  expect_policy(plan[0], 0.5, 0.2, 0.5, 0.62, 0.1);
  expect_policy(plan[1], 0.9, 0.9, 0.9, 0.94, 0.5);
  EXPECT_DOUBLE_EQ(plan[2].quality, 1.0);
  EXPECT_TRUE(plan[2].steps.empty());

  // The expected share binds too: predictions that promise less than what happened.
  for (auto& c : cases) c.predicted[0] = c.predicted[0] == 0.9 ? 0.7 : 0.2;
  // accept from 0.7: observed 0.9 but expected (6*0.7 + 4)/10 = 0.82, so it serves 0.82 at most.
  const auto cautious = autoq::plan_policies(cases);
  ASSERT_EQ(cautious.size(), 3u);
  EXPECT_DOUBLE_EQ(cautious[1].quality, 0.82);
  EXPECT_DOUBLE_EQ(cautious[1].threshold, 0.7);

  EXPECT_THROW(autoq::plan_policies({}), std::invalid_argument);
  cases[3].step_ms.pop_back();
  EXPECT_THROW(autoq::plan_policies(cases), std::invalid_argument);
  std::vector<autoq::PlanCase> long_ladder = {{std::vector<double>(9, 0.5), std::vector<bool>(9, true),
                                               std::vector<double>(9, 1.0), 10.0}};
  EXPECT_THROW(autoq::plan_policies(long_ladder), std::invalid_argument);
}

// On the real model: a step predicted above the policy's threshold answers with exactly that
// step's prefill (even below the target: the threshold, not the target, decides); a target
// above every policy answers with full prefill without running a step; rejected steps run in
// order and are counted; without a calibration, full prefill answers and says so.
TEST(AutoPrefill, RunsThePolicyOfTheTarget) {
  CF_REQUIRE_MODEL();
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest req = build_rag_request(
      m, {{"Warsaw", "Warsaw is the capital of Poland. Marie Curie was born there."}, {"Paris", "Paris is in France."}},
      "Where was Marie Curie born?");
  FusionOptions base;
  const double p60 = std::log(0.6 / 0.4);  // step 0 predicts 0.6 for every request
  const autoq::AutoCalibration c = autoq::AutoCalibration::parse(calibration_json(m.fingerprint_hex(), p60, 0.5), "t");

  autoq::AutoDecision d;
  FusionResult r = autoq::prefill(ex, req, base, &c, 0.9, d);
  EXPECT_EQ(d.method, "prophet");
  EXPECT_EQ(d.reason, autoq::kReasonAccepted);
  EXPECT_DOUBLE_EQ(d.ratio, 0.05);
  EXPECT_EQ(d.steps_run, 1u);
  EXPECT_NEAR(d.predicted_quality, 0.6, 1e-9);
  EXPECT_DOUBLE_EQ(d.threshold, 0.5);
  EXPECT_DOUBLE_EQ(d.to_json()["threshold"].get<double>(), 0.5);
  FusionOptions same = base;
  same.method = "prophet";
  same.ratio = 0.05;
  const FusionResult direct = ex.prefill(req, same);
  EXPECT_EQ(r.recomputed, direct.recomputed);
  EXPECT_EQ(test::max_diff(r.logits, direct.logits), 0.0f);

  r = autoq::prefill(ex, req, base, &c, 0.95, d);  // no policy serves 0.95: full prefill, no step run
  EXPECT_EQ(d.method, "full");
  EXPECT_EQ(d.reason, autoq::kReasonTarget);
  EXPECT_EQ(d.steps_run, 1u);
  EXPECT_EQ(d.trace.size(), 1u);
  FusionOptions full = base;
  full.method = "full";
  EXPECT_EQ(test::max_diff(r.logits, ex.prefill(req, full).logits), 0.0f);

  const autoq::AutoCalibration strict = autoq::AutoCalibration::parse(calibration_json(m.fingerprint_hex(), p60, 0.7), "t");
  r = autoq::prefill(ex, req, base, &strict, 0.9, d);  // both steps run and are rejected, full answers
  EXPECT_EQ(d.method, "full");
  EXPECT_EQ(d.steps_run, 3u);
  EXPECT_GT(d.decision_ms, 0.0);
  EXPECT_EQ(d.trace[0]["method"], "prophet");
  EXPECT_DOUBLE_EQ(d.trace[1]["ratio"].get<double>(), 0.3);
  EXPECT_EQ(d.trace[2]["method"], "full");
  EXPECT_EQ(d.reason, autoq::kReasonEscalated);

  // A size class that holds this request (from 1 context token): its policy, not the first
  // class's, runs, and the decision names the class.
  autoq::AutoCalibration by_size = c;
  autoq::AutoPolicy second_step;
  second_step.quality = 0.9;
  second_step.steps = {1};
  second_step.threshold = 0.0;
  by_size.size_classes.push_back({1, 10, {second_step}});
  r = autoq::prefill(ex, req, base, &by_size, 0.9, d);
  EXPECT_DOUBLE_EQ(d.ratio, 0.3);
  EXPECT_EQ(d.steps_run, 1u);
  EXPECT_EQ(d.to_json()["size_class"], 1);

  r = autoq::prefill(ex, req, base, nullptr, 0.9, d);
  EXPECT_FALSE(d.calibrated);
  EXPECT_EQ(d.method, "full");
  EXPECT_EQ(d.reason, autoq::kReasonUncalibrated);
  EXPECT_THROW(autoq::prefill(ex, req, base, &c, 0.0, d), std::invalid_argument);
}

// The cold-chunk rule (issue 60 item 2), on fixed numbers: the ladder costs the cold tokens
// plus the policy's share of full prefill's rows (context + suffix); all cold never runs it.
TEST(AutoColdChunks, PriceIsTheColdTokensPlusThePolicysShare) {
  const autoq::AutoCalibration c = autoq::AutoCalibration::parse(calibration_json("aa", 0.0), "t");
  const autoq::AutoPolicy& policy = c.policy_for(0.9, 1000);  // ttft_share 0.4
  autoq::ColdPrice p = autoq::price_cold_chunks(c, policy, 1000, 50, 500);
  EXPECT_DOUBLE_EQ(p.full_rows, 1050);
  EXPECT_DOUBLE_EQ(p.ladder_rows, 500 + 0.4 * 1050);
  EXPECT_TRUE(p.ladder());
  EXPECT_FALSE(autoq::price_cold_chunks(c, policy, 1000, 50, 700).ladder());  // 700 + 420 > 1050
  // Rows alone would run it here (50 + 0.4 x 150 < 150), but every chunk is cold.
  p = autoq::price_cold_chunks(c, policy, 50, 100, 50);
  EXPECT_LT(p.ladder_rows, p.full_rows);
  EXPECT_FALSE(p.ladder());
  // A policy file without ttft_share: the first step's rows (ρ 0.05 x 1000 + 50 = 100 rows).
  autoq::AutoPolicy unpriced = policy;
  unpriced.ttft_share = 0;
  EXPECT_DOUBLE_EQ(autoq::price_cold_chunks(c, unpriced, 1000, 50, 500).ladder_rows, 600);
  EXPECT_THROW(autoq::price_cold_chunks(c, autoq::AutoPolicy{}, 1000, 50, 500), std::invalid_argument);
}

// On the real model, an executor that prices cold chunks (the server's): a request whose
// chunks are all cold answers with full prefill at once, computes no chunk cache on its path
// and hands the caches back; once filled, the same request runs the ladder on them. Partly
// cold, the price decides: a small cold chunk beside a long warm one runs the ladder, the long
// one cold does not. The bench's executor (offline) runs the ladder on cold chunks, as before.
TEST(AutoPrefill, ColdChunksTakeFullPrefillAndAreFilledForTheNextRequest) {
  CF_REQUIRE_MODEL();
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  FusionExecutor priced(fwd, store, nullptr, ColdChunks::priced);
  std::string long_text;
  for (int i = 0; i < 12; ++i) long_text += "The old lighthouse of Carrow stands on a cliff above the harbour. ";
  const RagRequest req =
      build_rag_request(m, {{"Carrow", long_text}, {"Paris", "Paris is in France."}}, "Where is the lighthouse?");
  FusionOptions base;
  const autoq::AutoCalibration c =
      autoq::AutoCalibration::parse(calibration_json(m.fingerprint_hex(), std::log(0.6 / 0.4), 0.5), "t");
  FusionOptions step = base;
  step.method = "prophet";
  const std::vector<ChunkKey> keys = FusionExecutor::chunk_keys(m.fingerprint(), req, step);
  ASSERT_EQ(keys.size(), 2u);
  ASSERT_GT(req.chunks[0].size(), 8 * req.chunks[1].size());

  autoq::AutoDecision d;
  FusionResult r = autoq::prefill(priced, req, base, &c, 0.9, d);
  EXPECT_EQ(d.method, "full");
  EXPECT_EQ(d.reason, autoq::kReasonColdChunks);
  EXPECT_EQ(d.steps_run, 1u);
  EXPECT_EQ(d.cold_chunks, 2u);
  EXPECT_EQ(d.cold_tokens, req.context_tokens());
  EXPECT_EQ(d.to_json()["reason"], "cold_chunks");
  EXPECT_EQ(r.chunk_misses, 2u);  // prefilled in full, as the counts of a plain prefill say
  EXPECT_EQ(r.chunk_hits, 0u);
  FusionOptions full = base;
  full.method = "full";
  EXPECT_EQ(test::max_diff(r.logits, ex.prefill(req, full).logits), 0.0f);
  for (const ChunkKey& k : keys) EXPECT_FALSE(store.contains(k)) << "computed on the request's path";
  ASSERT_EQ(r.chunks_to_fill.size(), 2u);

  priced.fill(r.chunks_to_fill);
  for (const ChunkKey& k : keys) EXPECT_TRUE(store.contains(k));
  r = autoq::prefill(priced, req, base, &c, 0.9, d);
  EXPECT_EQ(d.method, "prophet");
  EXPECT_EQ(d.reason, autoq::kReasonAccepted);
  EXPECT_EQ(d.cold_chunks, 0u);
  EXPECT_EQ(r.chunk_hits, 2u);
  EXPECT_TRUE(r.chunks_to_fill.empty());
  EXPECT_FALSE(d.to_json().contains("cold_chunks"));

  store.remove(keys[1].id());  // the short chunk cold: cheaper than full prefill, the ladder runs
  r = autoq::prefill(priced, req, base, &c, 0.9, d);
  EXPECT_EQ(d.cold_chunks, 1u);
  ASSERT_TRUE(d.cold_price.has_value());
  EXPECT_TRUE(d.cold_price->ladder());
  EXPECT_EQ(d.method, "prophet");
  EXPECT_TRUE(r.chunks_to_fill.empty());  // the step computed it
  EXPECT_TRUE(store.contains(keys[1]));
  store.remove(keys[0].id());  // the long chunk cold: full prefill
  r = autoq::prefill(priced, req, base, &c, 0.9, d);
  EXPECT_EQ(d.reason, autoq::kReasonColdChunks);
  ASSERT_EQ(r.chunks_to_fill.size(), 1u);
  EXPECT_EQ(r.chunks_to_fill[0].key.id(), keys[0].id());

  store.remove(keys[1].id());
  r = autoq::prefill(ex, req, base, &c, 0.9, d);  // offline: the step computes them, as before
  EXPECT_EQ(d.method, "prophet");
  EXPECT_TRUE(r.chunks_to_fill.empty());
  EXPECT_GT(r.timings.offline_ms, 0.0);

  // No chunk at all: nothing to reuse, full prefill without running a step.
  r = autoq::prefill(priced, build_rag_request(m, {}, "Where is the lighthouse?"), base, &c, 0.9, d);
  EXPECT_EQ(d.reason, autoq::kReasonNoContext);
  EXPECT_EQ(d.steps_run, 1u);
}


// A four-step ladder (reuse, EPIC at 0.05, 0.15, 0.3) and a quality policy running steps 0, 1.
autoq::AutoCalibration four_step_calibration() {
  json j = calibration_json("aa", 0.0);
  j["steps"] = {{{"method", "reuse"}, {"ratio", 0.0}, {"weights", {0.0, 0.0, 0.0}}},
                {{"method", "epic"}, {"ratio", 0.05}, {"weights", {0.0, 0.0, 0.0}}},
                {{"method", "epic"}, {"ratio", 0.15}, {"weights", {0.0, 0.0, 0.0}}},
                {{"method", "epic"}, {"ratio", 0.3}, {"weights", {0.0, 0.0, 0.0}}}};
  j["policies"] = {{{"quality", 0.9}, {"steps", {0, 1}}, {"threshold", 0.5}, {"ttft_share", 0.4}}};
  return autoq::AutoCalibration::parse(j, "t");
}

// The latency budget's choice (issue 60 item 1) on a cost model with fixed numbers: 0.1 ms a
// row, one layer, no fixed cost; 1000 context tokens and 100 of suffix, so full prefill costs
// 110 ms and the steps 10, 15, 25 and 40 ms.
TEST(AutoBudget, PicksTheBestPlanThatFitsAndSaysWhichConstraintBound) {
  const autoq::AutoCalibration c = four_step_calibration();
  autoq::CostModel cost;
  cost.ms_per_row_layer = 0.1;
  auto plan = [&](const autoq::AutoPolicy* policy, double budget, size_t cold = 0) {
    return autoq::plan_budget(c, policy, cost, 1000, 100, cold, budget);
  };
  // ttft_ms alone: the best plan that fits, whatever it predicts.
  autoq::BudgetPlan p = plan(nullptr, 200);
  EXPECT_TRUE(p.full);
  EXPECT_TRUE(p.steps.empty());
  EXPECT_EQ(p.bound, autoq::kBoundNone);
  EXPECT_DOUBLE_EQ(p.predicted_ms, 110);
  p = plan(nullptr, 50);  // full does not fit; EPIC 0.3 (40 ms) is the best that does
  EXPECT_FALSE(p.full);
  EXPECT_EQ(p.final_step, 3);
  EXPECT_EQ(p.bound, autoq::kBoundTtft);
  EXPECT_DOUBLE_EQ(p.predicted_ms, 40);
  EXPECT_EQ(plan(nullptr, 20).final_step, 1);  // 15 ms
  p = plan(nullptr, 5);  // nothing fits: the cheapest plan, and it says so
  EXPECT_EQ(p.final_step, 0);
  EXPECT_EQ(p.bound, autoq::kBoundTtftUnmet);
  EXPECT_DOUBLE_EQ(p.predicted_ms, 10);
  // Cold chunks: the first step run pays their 500 rows; only reuse fits 60 ms then (60).
  EXPECT_EQ(plan(nullptr, 60, 500).final_step, 0);
  EXPECT_EQ(plan(nullptr, 59, 500).bound, autoq::kBoundTtftUnmet);

  // Quality and ttft_ms: the target's policy (steps 0, 1, then full prefill).
  const autoq::AutoPolicy& policy = c.policy_for(0.9, 1000);
  p = plan(&policy, 200);  // 10 + 15 + 110 fits: the target binds
  EXPECT_EQ(p.steps, (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(p.full);
  EXPECT_EQ(p.bound, autoq::kBoundQuality);
  EXPECT_DOUBLE_EQ(p.predicted_ms, 135);
  p = plan(&policy, 60);  // both steps fit (25), full does not: the best above them in 35 is EPIC 0.15
  EXPECT_EQ(p.steps, (std::vector<size_t>{0, 1}));
  EXPECT_FALSE(p.full);
  EXPECT_EQ(p.final_step, 2);
  EXPECT_EQ(p.bound, autoq::kBoundTtft);
  EXPECT_DOUBLE_EQ(p.predicted_ms, 50);
  p = plan(&policy, 12);  // only reuse fits, and nothing after it: reuse answers
  EXPECT_EQ(p.steps, (std::vector<size_t>{0}));
  EXPECT_FALSE(p.full);
  EXPECT_EQ(p.final_step, -1);
  EXPECT_EQ(p.bound, autoq::kBoundTtft);
  EXPECT_DOUBLE_EQ(p.predicted_ms, 10);
  EXPECT_EQ(plan(&policy, 5).bound, autoq::kBoundTtftUnmet);
  // Every chunk cold: the walk would cost more than full prefill, which meets the target too.
  p = plan(&policy, 200, 1000);
  EXPECT_TRUE(p.steps.empty());
  EXPECT_TRUE(p.full);
  EXPECT_EQ(p.bound, autoq::kBoundQuality);
  EXPECT_DOUBLE_EQ(p.predicted_ms, 110);
  EXPECT_THROW(plan(nullptr, 0), std::invalid_argument);
}

TEST(AutoBudget, TheCostModelIsRefreshedByAnExponentialAverage) {
  autoq::CostModel m;
  m.fixed_ms = 1;
  m.ms_per_row_layer = 0.01;
  m.layers = 2;
  EXPECT_DOUBLE_EQ(m.predict_ms(100), 3);
  m.observe(100, 5);  // (5 - 1) / (100 x 2) = 0.02 a row and layer
  EXPECT_DOUBLE_EQ(m.ms_per_row_layer, 0.8 * 0.01 + 0.2 * 0.02);
  EXPECT_EQ(m.observations, 1u);
  m.observe(0, 5);  // nothing to learn from
  EXPECT_EQ(m.observations, 1u);
}

// On the real model: the start-up measurement is positive and grows with the rows, and the walk follows the
// plan: a budget nothing meets answers with the cheapest step and says so; a free machine
// (zero cost) gives ttft_ms alone full prefill; each prefill refreshes the model.
TEST(AutoPrefill, ABudgetRunsItsPlanAndReportsPredictedAndActualTtft) {
  CF_REQUIRE_MODEL();
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  // No wall-clock bound here: a unit test under ASan or on a loaded machine cannot hold one (CI
  // failed on a 2 s bound under ASan); the measurement's size is the constant kMeasureRows.
  const autoq::CostModel measured = autoq::measure_cost_model(fwd);
  EXPECT_GT(measured.ms_per_row_layer, 0.0);
  EXPECT_GE(measured.fixed_ms, 0.0);
  EXPECT_GT(measured.predict_ms(autoq::kMeasureRows), measured.predict_ms(1));
  EXPECT_EQ(measured.layers, static_cast<size_t>(m.hparams().n_layers));

  const RagRequest req = build_rag_request(
      m, {{"Warsaw", "Warsaw is the capital of Poland. Marie Curie was born there."}, {"Paris", "Paris is in France."}},
      "Where was Marie Curie born?");
  const autoq::AutoCalibration c =
      autoq::AutoCalibration::parse(calibration_json(m.fingerprint_hex(), std::log(0.6 / 0.4), 0.5), "t");
  FusionOptions base;
  base.ttft_ms = 1e-3;
  autoq::CostModel slow;
  slow.fixed_ms = 1000;
  autoq::SharedCostModel slow_machine(slow);
  autoq::AutoDecision d;
  FusionResult r = autoq::prefill(ex, req, base, &c, 0.0, d, &slow_machine);
  EXPECT_EQ(d.bound, autoq::kBoundTtftUnmet);
  EXPECT_EQ(d.reason, autoq::kReasonBudget);
  EXPECT_EQ(d.method, "prophet");
  EXPECT_DOUBLE_EQ(d.ratio, 0.05);
  EXPECT_EQ(d.steps_run, 1u);
  EXPECT_DOUBLE_EQ(d.predicted_ttft_ms, 1000);
  // The store was cold: the step computed both caches, and the actual TTFT counts them.
  EXPECT_GT(r.timings.offline_ms, 0.0);
  EXPECT_DOUBLE_EQ(d.actual_ttft_ms, r.timings.ttft_ms + r.timings.offline_ms);
  EXPECT_DOUBLE_EQ(d.to_json()["ttft_budget_ms"].get<double>(), 1e-3);
  EXPECT_EQ(slow_machine.get().observations, 1u);

  // Each call gets its own free machine: a prefill refreshes the model it ran on, and under ASan
  // one full prefill teaches it well over the 100 ms budget (CI failed on a shared one).
  autoq::SharedCostModel free_machine(autoq::CostModel{});
  base.ttft_ms = 100;
  r = autoq::prefill(ex, req, base, &c, 0.0, d, &free_machine);
  EXPECT_EQ(d.method, "full");
  EXPECT_EQ(d.bound, autoq::kBoundNone);
  EXPECT_EQ(free_machine.get().observations, 1u);
  autoq::SharedCostModel another_free_machine(autoq::CostModel{});
  r = autoq::prefill(ex, req, base, &c, 0.9, d, &another_free_machine);  // the target's walk fits: as without a budget
  EXPECT_EQ(d.bound, autoq::kBoundQuality);
  EXPECT_EQ(d.method, "prophet");
  EXPECT_EQ(d.reason, autoq::kReasonAccepted);
  EXPECT_THROW(autoq::prefill(ex, req, base, &c, 0.0, d), std::invalid_argument);  // a budget needs a cost model
  r = autoq::prefill(ex, req, base, nullptr, 0.0, d, &slow_machine);  // no calibration: full prefill, priced
  EXPECT_EQ(d.method, "full");
  EXPECT_EQ(d.reason, autoq::kReasonUncalibrated);
  EXPECT_EQ(d.bound, autoq::kBoundNone);
  EXPECT_GE(d.predicted_ttft_ms, 1000.0);
}
}  // namespace
}  // namespace cf

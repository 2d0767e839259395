// The auto policy (issue 26, fusion/auto_quality.h): its signals, its predictor fit, its
// calibration files (another model's is refused), and its escalation over the real executor.
#include "fusion/auto_quality.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
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

json calibration_json(const std::string& fingerprint, double intercept0, double max0) {
  return {{"format", autoq::kCalibrationFormat},
          {"fingerprint", fingerprint},
          {"steps",
           {{{"method", "prophet"}, {"ratio", 0.05}, {"weights", {intercept0, 0.0, 0.0}}, {"max_predicted", max0}},
            {{"method", "prophet"}, {"ratio", 0.3}, {"weights", {-20.0, 0.0, 0.0}}, {"max_predicted", 0.0}}}}};
}

TEST(AutoCalibrationFile, ParsesWritesAndRefusesAnotherModel) {
  const json j = calibration_json("00112233aabbccdd", 3.0, 0.95);
  const autoq::AutoCalibration c = autoq::AutoCalibration::parse(j, "test");
  ASSERT_EQ(c.steps.size(), 2u);
  EXPECT_NEAR(c.predict(0, {}), 1 / (1 + std::exp(-3.0)), 1e-12);
  EXPECT_EQ(autoq::AutoCalibration::parse(c.to_json(), "again").to_json()["steps"], c.to_json()["steps"]);

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
  json v = j;
  v["format"] = "other/1";
  bad(v, "format must be");
  v = j;
  v["steps"] = json::array();
  bad(v, "\"steps\" must be a non-empty array");
  v = j;
  v["steps"][0]["weights"] = {1.0};
  bad(v, "step weights must have 3 numbers");
  v = j;
  v["steps"][0]["ratio"] = 2;
  bad(v, "step ratio must be in [0, 1]");
  v = j;
  v["steps"][1].erase("max_predicted");
  bad(v, "a step needs method, ratio, weights, max_predicted");
  // No calibration of a fingerprint no one made; the shipped one of the unit tests' model is
  // compiled in (data/auto_calibrations, cf_bundle_json).
  EXPECT_FALSE(autoq::find_calibration("0000000000000000").has_value());
  const auto shipped = autoq::find_calibration("8fe8bd56461abfd6");
  ASSERT_TRUE(shipped.has_value());
  EXPECT_EQ(shipped->fingerprint, "8fe8bd56461abfd6");
  EXPECT_EQ(shipped->steps.size(), 3u);
}

TEST(AutoDecisionRule, QualityBoundsAndSkippedSteps) {
  for (double q : {0.0, -0.1, 1.01, std::nan("")}) EXPECT_THROW(autoq::check_quality(q), std::invalid_argument) << q;
  EXPECT_NO_THROW(autoq::check_quality(1.0));
  const autoq::AutoCalibration c = autoq::AutoCalibration::parse(calibration_json("aa", 3.0, 0.95), "t");
  // p(step 0) = 0.953 for every request.
  EXPECT_TRUE(autoq::accepts(c, 0, {}, 0.9));
  EXPECT_FALSE(autoq::accepts(c, 0, {}, 0.96));
  EXPECT_TRUE(autoq::worth_running(c, 0, 0.95));
  EXPECT_FALSE(autoq::worth_running(c, 0, 0.96));  // never reached 0.96 on the calibration set
  EXPECT_FALSE(autoq::worth_running(c, 1, 0.5));

  // With what the step answered and cost on the calibration set: it reached 0.95 on 1 of 10
  // requests there. At 20% of full prefill's time that loses time on average (0.1 < 0.2);
  // at 5% it gains (0.1 > 0.05); at target 0.5 it answered 3 of 10, worth 20%.
  json j = calibration_json("aa", 3.0, 0.95);
  j["steps"][0]["predictions"] = {0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.6, 0.6, 0.95};
  j["steps"][0]["ttft_share"] = 0.2;
  autoq::AutoCalibration priced = autoq::AutoCalibration::parse(j, "t");
  EXPECT_FALSE(autoq::worth_running(priced, 0, 0.9));
  EXPECT_TRUE(autoq::worth_running(priced, 0, 0.5));
  priced.steps[0].ttft_share = 0.05;
  EXPECT_TRUE(autoq::worth_running(priced, 0, 0.9));
  EXPECT_EQ(autoq::AutoCalibration::parse(priced.to_json(), "again").steps[0].predictions, priced.steps[0].predictions);
  j["steps"][0]["predictions"] = {0.6, 0.1};
  EXPECT_THROW(autoq::AutoCalibration::parse(j, "t"), std::invalid_argument);  // not ascending
  j["steps"][0]["predictions"] = {0.1, 1.5};
  EXPECT_THROW(autoq::AutoCalibration::parse(j, "t"), std::invalid_argument);
}

// On the real model: a step predicted above the target answers with exactly that step's
// prefill; a target no step reaches answers with full prefill, after running only the
// steps worth running; without a calibration, full prefill answers and says so.
TEST(AutoPrefill, EscalatesToTheFirstStepThatReachesTheTarget) {
  CF_REQUIRE_MODEL();
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = test::memory_store(m);
  FusionExecutor ex(fwd, store);
  const RagRequest req = build_rag_request(
      m, {{"Warsaw", "Warsaw is the capital of Poland. Marie Curie was born there."}, {"Paris", "Paris is in France."}},
      "Where was Marie Curie born?");
  FusionOptions base;
  const autoq::AutoCalibration c = autoq::AutoCalibration::parse(calibration_json(m.fingerprint_hex(), 3.0, 0.95), "t");

  autoq::AutoDecision d;
  FusionResult r = autoq::prefill(ex, req, base, &c, 0.9, d);
  EXPECT_EQ(d.method, "prophet");
  EXPECT_DOUBLE_EQ(d.ratio, 0.05);
  EXPECT_EQ(d.steps_run, 1u);
  EXPECT_NEAR(d.predicted_quality, 1 / (1 + std::exp(-3.0)), 1e-9);
  FusionOptions same = base;
  same.method = "prophet";
  same.ratio = 0.05;
  const FusionResult direct = ex.prefill(req, same);
  EXPECT_EQ(r.recomputed, direct.recomputed);
  EXPECT_EQ(test::max_diff(r.logits, direct.logits), 0.0f);

  r = autoq::prefill(ex, req, base, &c, 0.99, d);  // step 0 not worth running, step 1 never reaches it
  EXPECT_EQ(d.method, "full");
  EXPECT_EQ(d.steps_run, 1u);
  EXPECT_EQ(d.trace.size(), 1u);
  FusionOptions full = base;
  full.method = "full";
  EXPECT_EQ(test::max_diff(r.logits, ex.prefill(req, full).logits), 0.0f);

  const autoq::AutoCalibration low = autoq::AutoCalibration::parse(calibration_json(m.fingerprint_hex(), -3.0, 0.95), "t");
  r = autoq::prefill(ex, req, base, &low, 0.9, d);  // step 0 runs, is rejected, full answers
  EXPECT_EQ(d.method, "full");
  EXPECT_EQ(d.steps_run, 2u);
  EXPECT_GT(d.decision_ms, 0.0);
  EXPECT_EQ(d.trace[0]["method"], "prophet");

  r = autoq::prefill(ex, req, base, nullptr, 0.9, d);
  EXPECT_FALSE(d.calibrated);
  EXPECT_EQ(d.method, "full");
  EXPECT_THROW(autoq::prefill(ex, req, base, &c, 0.0, d), std::invalid_argument);
}

}  // namespace
}  // namespace cf

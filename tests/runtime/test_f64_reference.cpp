// Full prefill, greedy decoding and NLL against the float64 reference: the exact dequantized
// model (tools/f64_reference.py), whose logits depend on no summation order. Fixtures
// tests/golden/<stem>.f64.json, made by tools/make_f64_golden.py; they also hold llama.cpp's
// own distance to the reference, from which the bounds are derived (numerics_contract.h;
// docs/ARCHITECTURE.md, "Numerics contract").
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model_fixture.h"
#include "numerics_contract.h"
#include "runtime/forward.h"
#include "runtime/sampler.h"

namespace cf {
namespace {

using nlohmann::json;

using test::kF64NearTie;
using test::kNllRelTol;

json load(const std::string& name) {
  std::ifstream in(test::fixture_path(name));
  if (!in) throw std::runtime_error("missing fixture tests/golden/" + name + " (tools/make_f64_golden.py)");
  return json::parse(in);
}

const json& smol_f64() {
  static json j = load("smollm2_q4_1.f64.json");
  return j;
}
const json& qwen05_f64() {
  static json j = load("qwen2.5_coder_0.5b_instruct_q4_k_m.f64.json");
  return j;
}
const json& qwen15_f64() {
  static json j = load("qwen2.5_coder_1.5b_instruct_q4_k_m.f64.json");
  return j;
}
const json& gemma3_f64() {
  static json j = load("gemma3_270m_q4_k_m.f64.json");
  return j;
}

double elapsed_s(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void check_fixture(const Model& m, const json& fx) {
  EXPECT_EQ(fx["model"]["size"].get<uint64_t>(), m.file().file_size())
      << "the f64 fixture was made from another model file; regenerate it with tools/make_f64_golden.py";
}

// Full prefill of every logits prompt against f64 at the ids llama.cpp listed.
void check_logits(const Model& m, const json& fx) {
  const auto t0 = std::chrono::steady_clock::now();
  Forward fwd(m, test::shared_pool());
  std::vector<double> diffs;
  int disagree = 0;
  double worst_margin = 0;  // f64's margin where our top-1 differs
  for (const auto& c : fx["logits"]) {
    const auto ids = c["prompt_ids"].get<std::vector<TokenId>>();
    KvCache cache(m.hparams());
    auto pos = test::iota_positions(ids.size());
    std::vector<size_t> rows(ids.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = i;
    auto out = fwd.run(cache, {ids, pos, {}, rows});
    const auto& positions = c["positions"];
    ASSERT_EQ(positions.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto& p = positions[i];
      const auto at_ids = p["ids"].get<std::vector<int>>();
      const auto at = p["at"].get<std::vector<double>>();
      const auto top = p["top_logits"].get<std::vector<double>>();
      const float* ours = out.row_logits(i);
      double here = 0;
      for (size_t k = 0; k < at_ids.size(); ++k) here = std::max(here, std::fabs(ours[at_ids[k]] - at[k]));
      diffs.push_back(here);
      if (std::getenv("CF_GOLDEN_VERBOSE")) std::printf("%s pos %zu diff %.4f\n", c["name"].get<std::string>().c_str(), i, here);
      const double margin = top[0] - top[1];
      if (argmax(ours, out.vocab) != p["top_ids"][0].get<int>()) {
        ++disagree;
        worst_margin = std::max(worst_margin, margin);
        EXPECT_LT(margin, kF64NearTie) << c["name"] << " position " << i << ": top-1 differs where f64 leads by " << margin;
      }
    }
  }
  std::sort(diffs.begin(), diffs.end());
  const double median = diffs[diffs.size() / 2], worst = diffs.back();
  const test::Tolerance t = test::tolerance_from(fx);
  const double max_bound = t.max_vs_f64(), med_bound = t.median_vs_f64(), l_max = t.l_max, l_med = t.l_median;
  const int top1_bound = t.top1_vs_f64(), l_disagree = t.l_top1_differ;
  std::printf("top-10 |logit diff| vs f64 over %zu positions: max %.3f (bound %.3f; llama.cpp %.3f), median %.3f "
              "(bound %.3f; llama.cpp %.3f); top-1 differs at %d (bound %d; llama.cpp %d), largest f64 margin there "
              "%.3f; %.1f s\n",
              diffs.size(), worst, max_bound, l_max, median, med_bound, l_med, disagree, top1_bound, l_disagree,
              worst_margin, elapsed_s(t0));
  EXPECT_EQ(static_cast<int>(diffs.size()), t.positions);
  EXPECT_LE(worst, max_bound);
  EXPECT_LE(median, med_bound);
  EXPECT_LE(disagree, top1_bound);
}

// Prefill then token-by-token decoding along f64's greedy path (its tokens fed back, so every
// step is compared, not only those before a first parting): each step's logits at f64's
// top-10 ids within the prefill bounds, and our top-1 equal to f64's token wherever f64 leads
// by kF64NearTie or more. Our own greedy continuation is this one up to the first step whose
// top-1 differs, so it equals f64's or parts at a near-tie.
void check_greedy(const Model& m, const json& fx) {
  const auto t0 = std::chrono::steady_clock::now();
  Forward fwd(m, test::shared_pool());
  int identical = 0, total = 0, differ_steps = 0;
  double worst_margin = 0;  // f64's margin where our top-1 differs
  std::vector<double> diffs;
  for (const auto& c : fx["greedy"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<TokenId>>();
    const auto want = c["output_ids"].get<std::vector<TokenId>>();
    const auto& steps = c["steps"];
    ASSERT_EQ(steps.size(), want.size());
    KvCache cache(m.hparams());
    auto pos = test::iota_positions(prompt.size());
    const size_t last = prompt.size() - 1;
    auto out = fwd.run(cache, {prompt, pos, {}, std::span<const size_t>(&last, 1), WeightMatrix::KQuantOrder::ByRowCount});
    int first = -1;
    for (size_t step = 0; step < want.size(); ++step) {
      const float* z = out.logits.data();
      const auto ids = steps[step]["top_ids"].get<std::vector<int>>();
      const auto ref = steps[step]["top_logits"].get<std::vector<double>>();
      double here = 0;
      for (size_t k = 0; k < ids.size(); ++k) here = std::max(here, std::fabs(z[ids[k]] - ref[k]));
      diffs.push_back(here);
      if (argmax(z, out.vocab) != want[step]) {
        const double margin = c["margins"][step].get<double>();
        ++differ_steps;
        worst_margin = std::max(worst_margin, margin);
        if (first < 0) first = static_cast<int>(step);
        EXPECT_LT(margin, kF64NearTie) << c["name"] << " step " << step << ": top-1 differs where f64 leads by " << margin;
      }
      if (step + 1 == want.size()) break;
      const TokenId t = want[step];
      const int32_t p = static_cast<int32_t>(prompt.size() + step);
      const size_t row = 0;
      out = fwd.run(cache, {std::span<const TokenId>(&t, 1), std::span<const int32_t>(&p, 1), {},
                            std::span<const size_t>(&row, 1), WeightMatrix::KQuantOrder::PerRow});
    }
    ++total;
    if (first < 0) {
      ++identical;
      continue;
    }
    std::printf("%s: our greedy parts from f64 at step %d (f64 top-1 margin there %.4f; llama.cpp %s)\n",
                c["name"].get<std::string>().c_str(), first, c["margins"][first].get<double>(),
                c["llama_equal"].get<bool>() ? "equal to f64"
                                             : ("parts at step " + std::to_string(c["first_difference"].get<int>())).c_str());
  }
  std::sort(diffs.begin(), diffs.end());
  const double median = diffs[diffs.size() / 2], worst = diffs.back();
  const test::Tolerance t = test::tolerance_from(fx);
  std::printf("decode steps along f64's path: %zu, top-10 |logit diff| max %.3f (bound %.3f), median %.3f (bound %.3f); "
              "top-1 differs at %d, largest f64 margin there %.3f; greedy identical to f64: %d of %d (llama.cpp: %d of "
              "%d); %.1f s\n",
              diffs.size(), worst, t.max_vs_f64(), median, t.median_vs_f64(), differ_steps, worst_margin, identical, total,
              fx["summary"]["greedy_equal"].get<int>(), fx["summary"]["greedy_total"].get<int>(), elapsed_s(t0));
  EXPECT_GE(total, 10);
  EXPECT_LE(worst, t.max_vs_f64());
  EXPECT_LE(median, t.median_vs_f64());
}

// Mean NLL of the fixture's fixed passage (prefilled in passes of 128 rows, every row's logits).
void check_nll(const Model& m, const json& fx) {
  const auto t0 = std::chrono::steady_clock::now();
  Forward fwd(m, test::shared_pool());
  const auto ids = fx["nll"]["ids"].get<std::vector<TokenId>>();
  KvCache cache(m.hparams());
  double total = 0;
  size_t count = 0;
  constexpr size_t kPass = 128;
  for (size_t b = 0; b < ids.size(); b += kPass) {
    const size_t n = std::min(kPass, ids.size() - b);
    auto pos = test::iota_positions(n, static_cast<int32_t>(b));
    std::vector<size_t> rows(n);
    for (size_t i = 0; i < n; ++i) rows[i] = i;
    auto out = fwd.run(cache, {std::span<const TokenId>(ids.data() + b, n), pos, {}, rows});
    for (size_t i = 0; i < n && b + i + 1 < ids.size(); ++i) {
      const float* z = out.row_logits(i);
      const double mx = *std::max_element(z, z + out.vocab);
      double sum = 0;
      for (size_t v = 0; v < out.vocab; ++v) sum += std::exp(static_cast<double>(z[v]) - mx);
      total += mx + std::log(sum) - z[ids[b + i + 1]];
      ++count;
    }
  }
  const double ours = total / static_cast<double>(count), ref = fx["nll"]["mean_nll"].get<double>();
  const double rel = std::fabs(ours - ref) / ref;
  std::printf("mean NLL over %zu predictions: ours %.5f, f64 %.5f, relative difference %.4f%% (bound %.2f%%); %.1f s\n",
              count, ours, ref, 100 * rel, 100 * kNllRelTol, elapsed_s(t0));
  EXPECT_EQ(count, fx["nll"]["n_predicted"].get<size_t>());
  EXPECT_LE(rel, kNllRelTol);
}

TEST(F64Reference, FixtureMatchesTheModelFile) {
  CF_REQUIRE_MODEL();
  check_fixture(test::shared_model(), smol_f64());
}

TEST(F64Reference, PromptLogitsWithinLlamaCppsDistance) {
  CF_REQUIRE_MODEL();
  check_logits(test::shared_model(), smol_f64());
}

TEST(F64Reference, GreedyContinuationsMatchF64) {
  CF_REQUIRE_MODEL();
  check_greedy(test::shared_model(), smol_f64());
}

TEST(F64Reference, MeanNllMatchesF64) {
  CF_REQUIRE_MODEL();
  check_nll(test::shared_model(), smol_f64());
}

TEST(F64ReferenceQwen05, FixtureMatchesTheModelFile) {
  CF_REQUIRE_QWEN05();
  check_fixture(test::shared_qwen05(), qwen05_f64());
}

TEST(F64ReferenceQwen05, PromptLogitsWithinLlamaCppsDistanceSlow) {
  CF_REQUIRE_QWEN05();
  check_logits(test::shared_qwen05(), qwen05_f64());
}

TEST(F64ReferenceQwen05, GreedyContinuationsMatchF64Slow) {
  CF_REQUIRE_QWEN05();
  check_greedy(test::shared_qwen05(), qwen05_f64());
}

// The default model's NLL contract.
TEST(F64ReferenceQwen05, MeanNllMatchesF64Slow) {
  CF_REQUIRE_QWEN05();
  check_nll(test::shared_qwen05(), qwen05_f64());
}

TEST(F64ReferenceGemma3, FixtureMatchesTheModelFile) {
  CF_REQUIRE_GEMMA3();
  check_fixture(test::shared_gemma3(), gemma3_f64());
}

// Slow: the 700-token prompt (past the 512-position window) with every row's logits.
TEST(F64ReferenceGemma3, PromptLogitsWithinLlamaCppsDistanceSlow) {
  CF_REQUIRE_GEMMA3();
  check_logits(test::shared_gemma3(), gemma3_f64());
}

TEST(F64ReferenceGemma3, GreedyContinuationsMatchF64Slow) {
  CF_REQUIRE_GEMMA3();
  check_greedy(test::shared_gemma3(), gemma3_f64());
}

TEST(F64ReferenceGemma3, MeanNllMatchesF64Slow) {
  CF_REQUIRE_GEMMA3();
  check_nll(test::shared_gemma3(), gemma3_f64());
}

// Manual check, as GoldenQwen15Manual (CI does not fetch the 1.5B). llama.cpp's position 0
// is 12-15 off f64 on this file (its 256-wide activation blocks meet the first token's
// outliers), so the max bound says little here; the median, top-1 and decoding checks do.
TEST(F64ReferenceQwen15Manual, FixtureMatchesTheModelFile) {
  CF_REQUIRE_QWEN15_MANUAL();
  check_fixture(test::shared_qwen15(), qwen15_f64());
}

TEST(F64ReferenceQwen15Manual, PromptLogitsWithinLlamaCppsDistanceSlow) {
  CF_REQUIRE_QWEN15_MANUAL();
  check_logits(test::shared_qwen15(), qwen15_f64());
}

TEST(F64ReferenceQwen15Manual, GreedyContinuationsMatchF64Slow) {
  CF_REQUIRE_QWEN15_MANUAL();
  check_greedy(test::shared_qwen15(), qwen15_f64());
}

TEST(F64ReferenceQwen15Manual, MeanNllMatchesF64Slow) {
  CF_REQUIRE_QWEN15_MANUAL();
  check_nll(test::shared_qwen15(), qwen15_f64());
}

}  // namespace
}  // namespace cf

// The shapes users run (issue 11, item 4): random-weight files with the exact layout of
// Qwen2.5-0.5B (qwen2: Q/K/V biases, 2 KV heads), Qwen3-0.6B (qwen3: QK-norm, head size 128
// with n_head * head_dim != d_model) and Llama-3.2-1B (llama: Llama 3 RoPE scaling through
// rope_freqs.weight, tied output), each quantized by llama.cpp to Q8_0 and Q4_K_M (which
// mixes Q4_K, Q6_K and, where a row is not a multiple of 256, Q5_0/Q8_0). Full prefill logits
// against llama.cpp's on the same file: fixtures tests/golden/shapes/<shape>.<type>.ref.json
// made by tools/make_shape_models.py (llama-cpp-python), files in <cache>/models/shapes
// (CHUNKFUSE_SHAPES_DIR overrides) made by the same script: the Q8_0 ones by
// `scripts/setup.sh --test-shapes` (the gguf package; CI), the Q4_K_M ones by
// `scripts/setup.sh --shapes` (llama.cpp's quantizer; not in CI, which has no llama.cpp:
// those tests skip when their file is missing and fail when it is wrong).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/paths.h"
#include "model_fixture.h"
#include "runtime/forward.h"
#include "runtime/sampler.h"

namespace cf {
namespace {

using nlohmann::json;

// How close is close. The batched matmuls of the Q8_0/Q5_0 matrices sum in an order of our
// own (the panel GEMM, model/kernels_panel.h; docs/ARCHITECTURE.md, "Numerics contract"),
// the K-quants in llama.cpp's tiled-GEMM order; the rest (RMSNorm, RoPE with the Llama 3
// factors, biases, QK-norm, attention, SiLU) follows llama.cpp's operations. So the logits
// sit within the spread that llama.cpp's own evaluations show, not at its bits: measured on
// the Q8_0 files (random weights, 26 positions) max 0.31-0.41, median 0.18-0.24 (they were
// 0.0000 when every order was llama.cpp's); llama.cpp itself moves SmolLM2's logits by up to
// 0.69 between its batched and token-by-token evaluation and by ~1.2 between its ISAs. A
// real error (a wrong row of a matrix, a wrong RoPE factor) moves them by whole units.
// Top-1: our argmax over the whole vocabulary must be llama.cpp's top-1 wherever
// llama.cpp's margin (top-1 minus top-2) exceeds twice the largest deviation of our top-10
// logits at that position: there, no deviation of that size can swap the two, so only a
// real error can.
struct Bounds {
  float max_diff, median_diff;
};
Bounds bounds_for(const std::string&) { return {0.8f, 0.35f}; }

std::string shapes_dir() {
  if (const char* d = std::getenv("CHUNKFUSE_SHAPES_DIR"); d && *d) return d;
  return cache_root() + "/models/shapes";
}

class ShapesSlow : public ::testing::TestWithParam<std::string> {};

TEST_P(ShapesSlow, PromptLogitsMatchLlamaCpp) {
  const std::string gguf = shapes_dir() + "/" + GetParam() + ".gguf";
  const std::string ref_path = test::fixture_path("shapes/" + GetParam() + ".ref.json");
  const bool q8 = GetParam().ends_with(".Q8_0");
  if (!std::filesystem::exists(gguf)) {
    if (!q8) GTEST_SKIP() << gguf << " not made (scripts/setup.sh --shapes: needs llama.cpp's quantizer)";
    if (std::getenv("CHUNKFUSE_ALLOW_NO_MODEL")) GTEST_SKIP() << "no shape files";
    FAIL() << "missing " << gguf << " (run scripts/setup.sh --test-shapes)";
  }
  std::ifstream in(ref_path);
  ASSERT_TRUE(in) << "missing fixture " << ref_path;
  const json ref = json::parse(in);
  auto model = Model::load(gguf);
  ASSERT_EQ(ref["model"]["size"].get<uint64_t>(), model->file().file_size())
      << gguf << " is not the file " << ref_path << " was made from; remake it with tools/make_shape_models.py --force";
  Forward fwd(*model, test::shared_pool());
  const Bounds bound = bounds_for(GetParam());
  if (model->hparams().arch == "llama") {  // the Llama 3 shapes carry their RoPE scaling
    ASSERT_EQ(model->hparams().rope_freq_factors.size(), static_cast<size_t>(model->hparams().head_dim / 2));
    EXPECT_EQ(model->hparams().rope_freq_factors.front(), 1.0f);
    EXPECT_EQ(model->hparams().rope_freq_factors.back(), 32.0f);
  }

  float worst = 0;
  size_t positions = 0, top1_same = 0, top1_checked = 0;
  std::vector<float> diffs;
  for (const auto& c : ref["logits"]) {
    const auto ids = c["prompt_ids"].get<std::vector<TokenId>>();
    KvCache cache(model->hparams());
    const auto pos = test::iota_positions(ids.size());
    std::vector<size_t> rows(ids.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = i;
    const auto out = fwd.run(cache, {ids, pos, {}, rows});
    ASSERT_EQ(c["positions"].size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto& p = c["positions"][i];
      const auto ref_ids = p["ids"].get<std::vector<int>>();
      const auto ref_logits = p["logits"].get<std::vector<float>>();
      const float* ours = out.row_logits(i);
      float here = 0;
      for (size_t k = 0; k < ref_ids.size(); ++k) here = std::max(here, std::fabs(ours[ref_ids[k]] - ref_logits[k]));
      diffs.push_back(here);
      worst = std::max(worst, here);
      ++positions;
      const bool same = argmax(ours, out.vocab) == ref_ids[0];
      top1_same += same;
      if (p["margin"].get<float>() > 2 * here) {
        ++top1_checked;
        EXPECT_TRUE(same) << c["name"] << " position " << i << ": top-1 " << argmax(ours, out.vocab) << ", llama.cpp "
                          << ref_ids[0] << " (margin " << p["margin"] << ")";
      }
      EXPECT_LE(here, bound.max_diff) << c["name"] << " position " << i;
    }
  }
  std::sort(diffs.begin(), diffs.end());
  std::printf("%s: top-10 |logit diff| vs llama.cpp over %zu positions: median %.4f, max %.4f; top-1 equal at %zu, "
              "required at %zu (margin above twice the deviation)\n",
              GetParam().c_str(), positions, diffs[diffs.size() / 2], worst, top1_same, top1_checked);
  EXPECT_LE(diffs[diffs.size() / 2], bound.median_diff);
  if (worst > 2.0f)
    ADD_FAILURE() << "logits far from the fixture's: are " << gguf << "'s weights the fixture's? (seed 11, numpy "
                  << "2.4.6 and gguf 0.19.0 as pinned in scripts/setup.sh; remake with --force)";
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ShapesSlow,
                         ::testing::Values("qwen2.5-0.5b.Q8_0", "qwen2.5-0.5b.Q4_K_M", "qwen3-0.6b.Q8_0",
                                           "qwen3-0.6b.Q4_K_M", "llama3.2-1b.Q8_0", "llama3.2-1b.Q4_K_M"),
                         param_name);

}  // namespace
}  // namespace cf

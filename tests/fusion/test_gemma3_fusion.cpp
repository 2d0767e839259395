// The fused prefill on a sliding-window model (Gemma 3 270M, real file): the request is
// longer than the 512-position window of the local layers, so the question's local layers
// cannot see the first passage at all. The invariants hold as on SmolLM2 (rho = 1 is full
// prefill, rho = 0 is full reuse) and every selector runs at a middle ratio.
// The rule for local layers is in src/fusion/executor.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "../runtime/model_fixture.h"
#include "fusion_invariants.h"
#include "fusion/methods.h"
#include "fusion/executor.h"
#include "fusion/qcfuse.h"
#include "runtime/sampler.h"

namespace cf {
namespace {

using test::max_diff;
using test::memory_store;

// A short first passage, then four of about 130 tokens: the first passage ends more than
// 512 positions before the question, with as few tokens as that takes (the K-quant weights
// still run through the reference kernels, about 25 tokens/s of prefill on 2 cores).
std::vector<Passage> long_passages() {
  const char* topics[][2] = {
      {"Lake Vostok", "Lake Vostok lies under four kilometres of Antarctic ice. Its water has been sealed for millions of years."},
      {"Basalt", "Basalt is a fine-grained volcanic rock. It forms most of the ocean floor and cools quickly from lava."},
      {"Monsoon", "The monsoon is a seasonal reversal of winds. It brings heavy summer rain to South Asia and feeds the rivers."},
      {"Telegraph", "The electric telegraph sent coded pulses along wires. Undersea cables linked continents by the 1870s."},
  };
  std::vector<Passage> out{{"Vostok", "Lake Vostok lies under four kilometres of ice."}};
  for (const auto& t : topics) {
    std::string text;
    for (int i = 0; i < 4; ++i)
      text += std::string(t[1]) + " Observation " + std::to_string(i + 1) + " of the survey confirmed this. ";
    out.push_back({t[0], text});
  }
  return out;
}

RagRequest request(const Model& m, const std::vector<Passage>& passages) {
  RagPromptOptions opt;
  opt.use_chat_template = false;  // a base model without a chat template
  opt.system = "Answer from the passages.";
  return build_rag_request(m, passages, "How thick is the ice above Lake Vostok?", opt);
}

class Gemma3Fusion : public ::testing::Test {
 protected:
  void SetUp() override {
    CF_REQUIRE_GEMMA3();
    const Model& m = test::shared_gemma3();
    req_ = request(m, long_passages());
    // The first passage's tokens are out of the question's local window.
    ASSERT_GT(req_.context_tokens(), static_cast<size_t>(m.hparams().sliding_window) + req_.chunks[0].size());
  }
  RagRequest req_;
};

TEST_F(Gemma3Fusion, RatioOneReproducesFullPrefillForEverySelectorSlow) {
  test::FusionRig rig(test::shared_gemma3());
  auto& [m, fwd, store, ex] = rig;
  test::expect_ratio_one_is_full_prefill(ex, req_);
}

TEST_F(Gemma3Fusion, RatioZeroIsFullReuseForEverySelectorSlow) {
  test::FusionRig rig(test::shared_gemma3());
  auto& [m, fwd, store, ex] = rig;
  test::expect_ratio_zero_is_reuse(ex, req_);
}

// The same two invariants on prefixed chunk caches (computed after S, issue 14): with the
// sliding window S's rows fall out of a chunk's local window exactly as in full prefill.
TEST_F(Gemma3Fusion, InvariantsHoldOnPrefixedCachesSlow) {
  const Model& m = test::shared_gemma3();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m), fresh = memory_store(m);  // fresh: no Cache-Craft variants
  FusionExecutor ex(fwd, store), ex0(fwd, fresh);                // that the rho = 1 runs created
  test::expect_ratio_one_is_full_prefill(ex, req_, ChunkContext::prefixed);
  test::expect_ratio_zero_is_reuse(ex0, req_, ChunkContext::prefixed);
}

// A small RAG request (inside one window) at rho = 0.3: every selector runs on Gemma 3.
TEST_F(Gemma3Fusion, EverySelectorRunsAtAMiddleRatioSlow) {
  test::FusionRig rig(test::shared_gemma3());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest small = request(m, {{"Vostok", "Lake Vostok lies under four kilometres of Antarctic ice."},
                                       {"Basalt", "Basalt is a fine-grained volcanic rock of the ocean floor."},
                                       {"Monsoon", "The monsoon brings heavy summer rain to South Asia."}});
  const size_t n = small.context_tokens();
  for (const std::string& method : selector_names()) {
    if (method == "reuse") continue;
    const FusionResult r = ex.prefill(small, {method, 0.3, 1});
    EXPECT_EQ(r.recomputed.size(), recompute_budget(0.3, n)) << method;
    for (size_t s : r.recomputed) {
      EXPECT_GE(s, small.system.size()) << method;
      EXPECT_LT(s, small.system.size() + n) << method;
    }
    EXPECT_EQ(r.cache.size(), small.flatten().size()) << method << ": probe entries left behind";
    ASSERT_EQ(r.logits.size(), static_cast<size_t>(m.hparams().vocab_size)) << method;
    EXPECT_TRUE(std::all_of(r.logits.begin(), r.logits.end(), [](float x) { return std::isfinite(x); })) << method;
  }
}

std::vector<int> global_layers(const ModelHparams& h) {
  std::vector<int> out;
  for (int l = 0; l < h.n_layers; ++l)
    if (!h.is_local(l)) out.push_back(l);
  return out;
}

// QCFuse's critical layers on a sliding-window model come from the global layers only: the
// calibration prompts fit a local layer's window, served prompts need not (qcfuse.h,
// LayerCandidates). The profiler's default does so, every layer's recall is still reported,
// and the profile shipped for this model names global layers only.
TEST(Gemma3Qcfuse, CriticalLayersAreGlobalLayersSlow) {
  CF_REQUIRE_GEMMA3();
  const Model& m = test::shared_gemma3();
  const std::vector<int> global = global_layers(m.hparams());
  ASSERT_FALSE(global.empty());
  ASSERT_LT(global.size(), static_cast<size_t>(m.hparams().n_layers));
  const auto shipped = qcfuse::bundled_profile(m.fingerprint_hex());
  ASSERT_TRUE(shipped.has_value());
  for (int l : shipped->critical_layers) EXPECT_FALSE(m.hparams().is_local(l)) << "shipped critical layer " << l;
  // The older evidence profile (11, 17, 10) still ships by name; its local layer is said.
  {
    Forward fwd(m, test::shared_pool());
    ChunkStore store = memory_store(m);
    FusionExecutor ex(fwd, store);
    const RagRequest small = request(m, {{"Vostok", "Lake Vostok lies under four kilometres of Antarctic ice."},
                                         {"Basalt", "Basalt is a fine-grained volcanic rock of the ocean floor."}});
    FusionOptions o{"qcfuse", 0.3, 1};
    o.method_options = {{"profile", "prophet"}};  // the shipped default's file (not a cached profile)
    const std::string shipped_source = ex.prefill(small, o).selection_details.at("layers_source");
    EXPECT_EQ(shipped_source.find("sliding-window"), std::string::npos) << shipped_source;
    o.method_options = {{"profile", "evidence"}};
    const std::string evidence = ex.prefill(small, o).selection_details.at("layers_source");
    EXPECT_NE(evidence.find("sliding-window layer(s) 10,"), std::string::npos) << evidence;
  }

  const std::string dir = test::shared_datasets_dir();
  if (!std::filesystem::exists(dir + "/hotpotqa_dev200.jsonl") || !std::filesystem::exists(dir + "/nq_open_oracle.jsonl.gz"))
    GTEST_SKIP() << "calibration data not found in ../shared/datasets";
  auto examples = qcfuse::read_nq_calibration(dir + "/nq_open_oracle.jsonl.gz", 1);
  for (auto& e : qcfuse::read_hotpot_calibration(dir + "/hotpotqa_dev200.jsonl", 1)) examples.push_back(std::move(e));
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  qcfuse::ProfileOptions opt;
  opt.target = qcfuse::ProfileTarget::prophet;
  const qcfuse::LayerProfile p = qcfuse::profile_critical_layers(fwd, store, examples, opt);
  ASSERT_EQ(p.recall.size(), static_cast<size_t>(m.hparams().n_layers));
  EXPECT_EQ(p.data.at("candidate_layers").get<std::vector<int>>(), global);
  ASSERT_EQ(p.critical_layers.size(), std::min<size_t>(3, global.size()));
  for (int l : p.critical_layers) EXPECT_FALSE(m.hparams().is_local(l)) << "critical layer " << l;
}

}  // namespace
}  // namespace cf

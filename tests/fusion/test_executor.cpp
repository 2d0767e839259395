// Invariants of the fused prefill (DESIGN.md), on the real model: rho = 1 reproduces full
// prefill and rho = 0 reproduces full reuse, for every selector.
#include <gtest/gtest.h>

#include <cmath>

#include "../runtime/model_fixture.h"
#include "fusion/executor.h"
#include "runtime/sampler.h"

namespace cf {
namespace {

std::vector<Passage> passages() {
  return {
      {"Marie Curie", "Marie Curie was a physicist and chemist who pioneered research on radioactivity. She won "
                      "Nobel Prizes in physics (1903) and chemistry (1911)."},
      {"Warsaw", "Warsaw is the capital and largest city of Poland. Marie Curie was born there in 1867."},
      {"Sorbonne", "The Sorbonne in Paris is where Curie studied and later became the first woman professor."},
  };
}

ChunkStore memory_store(const Model& m) {
  ChunkStoreOptions o;
  o.model = StoreModel{m.fingerprint(), m.hparams()};
  return ChunkStore(o);
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

class Fusion : public ::testing::Test {
 protected:
  void SetUp() override { CF_REQUIRE_MODEL(); }
};

TEST_F(Fusion, RatioOneReproducesFullPrefillForEverySelector) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  FusionExecutor ex(fwd, store);
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  const FusionResult full = ex.prefill(req, {"full", 1.0, 0});
  for (const std::string& method : selector_names()) {
    if (method == "reuse") continue;  // defined at rho = 0 only
    const FusionResult r = ex.prefill(req, {method, 1.0, 0});
    EXPECT_EQ(r.recomputed.size(), req.context_tokens()) << method;
    EXPECT_LE(max_diff(r.logits, full.logits), 1e-4f) << method;
    EXPECT_EQ(argmax(r.logits.data(), r.logits.size()), argmax(full.logits.data(), full.logits.size())) << method;
    EXPECT_EQ(r.cache.size(), full.cache.size());
  }
}

TEST_F(Fusion, RatioZeroIsFullReuseForEverySelector) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  FusionExecutor ex(fwd, store);
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  const FusionResult reuse = ex.prefill(req, {"reuse", 0.0, 0});
  EXPECT_TRUE(reuse.recomputed.empty());
  const FusionResult full = ex.prefill(req, {"full", 1.0, 0});
  EXPECT_GT(max_diff(reuse.logits, full.logits), 1e-3f) << "reuse should differ from full prefill";
  for (const std::string& method : selector_names()) {
    const FusionResult r = ex.prefill(req, {method, 0.0, 0});
    EXPECT_TRUE(r.recomputed.empty()) << method;
    if (method == "cacheblend") continue;  // refreshes its first layers for every token by design
    EXPECT_LE(max_diff(r.logits, reuse.logits), 1e-5f) << method;
  }
}

TEST_F(Fusion, SelectorsRespectTheBudgetAndStayInTheContext) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  FusionExecutor ex(fwd, store);
  const RagRequest req = build_rag_request(m, passages(), "Which prizes did Curie win?");
  const size_t n = req.context_tokens();
  for (const std::string& method : selector_names()) {
    if (method == "reuse") continue;
    const FusionResult r = ex.prefill(req, {method, 0.15, 3});
    EXPECT_EQ(r.recomputed.size(), recompute_budget(0.15, n)) << method;
    for (size_t s : r.recomputed) {
      EXPECT_GE(s, req.system.size()) << method;
      EXPECT_LT(s, req.system.size() + n) << method;
    }
    EXPECT_TRUE(std::is_sorted(r.recomputed.begin(), r.recomputed.end())) << method;
    EXPECT_EQ(r.cache.size(), req.flatten().size()) << method << ": probe entries left behind";
  }
  // Caches were computed once, then served from the store.
  EXPECT_GT(store.stats().memory_hits, 0u);
}

TEST_F(Fusion, RejectsBadOptions) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  FusionExecutor ex(fwd, store);
  const RagRequest req = build_rag_request(m, passages(), "Q?");
  EXPECT_THROW(ex.prefill(req, {"nonsense", 0.1, 0}), std::invalid_argument);
  EXPECT_THROW(ex.prefill(req, {"epic", 1.5, 0}), std::invalid_argument);
  EXPECT_THROW(ex.prefill(req, {"epic", -0.1, 0}), std::invalid_argument);
}

}  // namespace
}  // namespace cf

// Chunk-cache variants (issue 14): `alone` (PIC, from position 0) and `prefixed` (after S,
// FusionRAG eq. 5). A prefixed cache is exactly the chunk's rows of one pass over S + chunk,
// the two are keyed apart, and every selector keeps its invariants on prefixed caches.
#include <gtest/gtest.h>

#include "../kv/kv_test_util.h"
#include "../runtime/model_fixture.h"
#include "fusion/methods.h"
#include "fusion/executor.h"
#include "fusion_invariants.h"

namespace cf {
namespace {

using test::max_kv_diff;

std::vector<Passage> passages() {
  return {
      {"Marie Curie", "Marie Curie was a physicist and chemist who pioneered research on radioactivity."},
      {"Warsaw", "Warsaw is the capital and largest city of Poland. Marie Curie was born there in 1867."},
      {"Sorbonne", "The Sorbonne in Paris is where Curie studied and later became the first woman professor."},
  };
}

class ChunkVariants : public ::testing::Test {
 protected:
  void SetUp() override { CF_REQUIRE_MODEL(); }
};

TEST(ChunkVariantNames, ParseAndPrint) {
  ChunkContext v;
  ASSERT_TRUE(parse_chunk_context("prefixed", v));
  EXPECT_EQ(v, ChunkContext::prefixed);
  ASSERT_TRUE(parse_chunk_context("alone", v));
  EXPECT_EQ(v, ChunkContext::alone);
  EXPECT_FALSE(parse_chunk_context("Prefixed", v));
  EXPECT_FALSE(parse_chunk_context("", v));
  EXPECT_STREQ(chunk_context_name(ChunkContext::prefixed), "prefixed");
}

TEST(ChunkVariantKeys, VariantAndSystemPrefixArePartOfTheKey) {
  const std::vector<TokenId> chunk = {5, 6, 7}, s1 = {1, 2}, s2 = {1, 3};
  const ChunkKey alone = base_chunk_key(42, chunk, ChunkContext::alone, s1);
  const ChunkKey pre1 = base_chunk_key(42, chunk, ChunkContext::prefixed, s1);
  EXPECT_EQ(alone, ChunkKey(42, chunk)) << "alone is today's PIC key (existing stores stay valid)";
  EXPECT_EQ(alone, base_chunk_key(42, chunk, ChunkContext::alone, s2)) << "alone does not depend on S";
  EXPECT_NE(alone.id(), pre1.id());
  EXPECT_EQ(pre1.context().kind, ContextKind::after_prefix);
  EXPECT_EQ(pre1.id(), base_chunk_key(42, chunk, ChunkContext::prefixed, s1).id());
  EXPECT_NE(pre1.id(), base_chunk_key(42, chunk, ChunkContext::prefixed, s2).id()) << "a hash of S is in the key";
  EXPECT_TRUE(base_chunk_prefix(ChunkContext::alone, s1).empty());
  EXPECT_EQ(base_chunk_prefix(ChunkContext::prefixed, s1).size(), s1.size());
}

TEST_F(ChunkVariants, PrefixedCacheIsExactlyTheChunkRowsOfOnePassOverSAndChunk) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  const std::vector<TokenId>& chunk = req.chunks[1];
  const ChunkKey key = base_chunk_key(m.fingerprint(), chunk, ChunkContext::prefixed, req.system);
  const ChunkCache c = compute_chunk_cache(fwd, key, base_chunk_prefix(ChunkContext::prefixed, req.system));
  ASSERT_EQ(c.n_tokens(), chunk.size());
  EXPECT_EQ(c.kv.position(0), static_cast<int32_t>(req.system.size())) << "stored at its place after S";

  std::vector<TokenId> all = req.system;
  all.insert(all.end(), chunk.begin(), chunk.end());
  KvCache one_pass(m.hparams());
  fwd.run(one_pass, {all, test::iota_positions(all.size()), {}, {}});
  KvCache want(m.hparams());
  want.append_from(one_pass, req.system.size(), all.size(), 0);
  EXPECT_EQ(max_kv_diff(c.kv, want), 0.0f) << "bit-exact: the forward pass is batch-invariant";

  // And not the alone cache: its rows saw no S.
  const ChunkCache alone = compute_chunk_cache(fwd, ChunkKey(m.fingerprint(), chunk));
  KvCache moved(m.hparams());
  moved.append_from(alone.kv, 0, alone.n_tokens(), static_cast<int32_t>(req.system.size()));
  EXPECT_GT(max_kv_diff(moved, want), 1e-2f);
}

TEST_F(ChunkVariants, ReuseOfPrefixedCachesServesTheFirstChunkExactlyAndStoresItApart) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  const FusionResult full = ex.prefill(req, {"full", 1.0, 0});
  const FusionResult pre = ex.prefill(req, test::run_options("reuse", 0.0, ChunkContext::prefixed));
  const FusionResult alone = ex.prefill(req, test::run_options("reuse", 0.0, ChunkContext::alone));
  // Both variants were computed and are stored under their own keys.
  for (const auto& chunk : req.chunks) {
    EXPECT_TRUE(store.contains(base_chunk_key(m.fingerprint(), chunk, ChunkContext::alone, req.system)));
    EXPECT_TRUE(store.contains(base_chunk_key(m.fingerprint(), chunk, ChunkContext::prefixed, req.system)));
  }
  // The first chunk follows S in the request exactly as in its prefixed cache.
  const size_t s = req.system.size(), n0 = req.chunks[0].size();
  KvCache a(m.hparams()), b(m.hparams());
  a.append_from(full.cache, s, s + n0, 0);
  b.append_from(pre.cache, s, s + n0, 0);
  EXPECT_EQ(max_kv_diff(a, b), 0.0f);
  KvCache c(m.hparams());
  c.append_from(alone.cache, s, s + n0, 0);
  EXPECT_GT(max_kv_diff(a, c), 1e-2f);
}

TEST_F(ChunkVariants, RatioOneReproducesFullPrefillForEverySelectorOnPrefixedCaches) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  test::expect_ratio_one_is_full_prefill(ex, build_rag_request(m, passages(), "Where was Marie Curie born?"),
                                         ChunkContext::prefixed);
}

TEST_F(ChunkVariants, RatioZeroIsReuseForEverySelectorOnPrefixedCaches) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  test::expect_ratio_zero_is_reuse(ex, build_rag_request(m, passages(), "Where was Marie Curie born?"),
                                   ChunkContext::prefixed);
}

TEST_F(ChunkVariants, EverySelectorRunsOnPrefixedCachesWithinItsBudget) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest req = build_rag_request(m, passages(), "Which prizes did Curie win?");
  const size_t n = req.context_tokens();
  for (const std::string& method : selector_names()) {
    if (method == "reuse") continue;
    const FusionResult r = ex.prefill(req, test::run_options(method, 0.3, ChunkContext::prefixed));
    EXPECT_EQ(r.recomputed.size(), recompute_budget(0.3, n)) << method;
    for (size_t slot : r.recomputed) {
      EXPECT_GE(slot, req.system.size()) << method;
      EXPECT_LT(slot, req.system.size() + n) << method;
    }
    EXPECT_EQ(r.chunk_misses + r.chunk_hits, req.chunks.size()) << method;
  }
}

}  // namespace
}  // namespace cf

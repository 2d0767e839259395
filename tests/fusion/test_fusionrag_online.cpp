// FusionRAG's online side of eq. 10: the enriched variant the selector serves is the one
// enrichment computed, at the request's position. When a chunk's neighbours are exactly the
// chunks before it in the request (as base caches: PIC for alone, S-prefixed for prefixed,
// the paper's eq. 5), serving its enriched cache at ratio 0 must reproduce computing the
// chunk, and then U, directly after S + those base caches.
#include <gtest/gtest.h>

#include <cmath>

#include "../kv/kv_test_util.h"
#include "../runtime/model_fixture.h"
#include "fusionrag_test_corpus.h"
#include "fusion/executor.h"
#include "fusion/fusionrag_enrich.h"
#include "fusion_rig.h"

namespace cf {
namespace {

using test::max_kv_diff;

// Entries [begin, end) of `kv` moved by `delta` positions, as a cache of their own.
KvCache rows(const KvCache& kv, size_t begin, size_t end, int32_t delta = 0) {
  KvCache out(kv.hparams());
  out.append_from(kv, begin, end, delta);
  return out;
}

class FusionRagOnline : public ::testing::Test {
 protected:
  void SetUp() override { CF_REQUIRE_MODEL(); }
};

void expect_enriched_chunk_equals_computing_it_after_its_neighbours(ChunkContext variant) {
  const Model& m = test::shared_model();
  const ModelHparams& h = m.hparams();
  Forward fwd(m, test::shared_pool());
  ChunkStoreOptions so;
  so.durable = false;
  so.model = StoreModel{m.fingerprint(), h};
  ChunkStore store(so);
  const auto passages = test::fusionrag_corpus();
  const auto chunks = corpus_chunks(m, passages);
  EnrichOptions eo;
  eo.neighbours = 2;
  eo.system = default_system_tokens(m);
  eo.limit = 1;  // only Curie's passage: the others are served as base caches
  eo.chunk_context = variant;
  ASSERT_EQ(enrich_corpus(fwd, store, chunks, eo).enriched, 1u);
  auto base_key = [&](size_t i) { return base_chunk_key(m.fingerprint(), chunks[i].tokens, variant, eo.system); };
  const ChunkKey pic_key = base_key(0);
  const auto link = fusionrag_link(*store.get(pic_key));
  ASSERT_TRUE(link);
  ASSERT_EQ(link->neighbours.size(), 2u);
  std::vector<size_t> nb;  // corpus indices of the neighbours, most similar first
  for (const auto& id : link->neighbours)
    for (size_t i = 0; i < chunks.size(); ++i)
      if (base_key(i).id() == id) nb.push_back(i);
  ASSERT_EQ(nb.size(), 2u);

  // The request puts the neighbours first, in eq. 10's order, then the chunk: it sits where
  // enrichment computed it, after exactly the context enrichment gave it.
  FusionExecutor ex(fwd, store);
  const std::string question = "Where was Marie Curie born?";
  const RagRequest req = build_rag_request(m, {passages[nb[0]], passages[nb[1]], passages[0]}, question);
  ASSERT_EQ(req.system, eo.system);
  FusionOptions opt{"fusionrag", 0.0, 0};
  opt.chunk_context = variant;
  const FusionResult got = ex.prefill(req, opt);
  ASSERT_EQ(got.selection_details["chunks"][2], "enriched");
  ASSERT_EQ(got.selection_details["chunks"][0], "base: not enriched");

  // Directly: S, the neighbours' base caches at consecutive positions, then the chunk and U.
  KvCache direct(h);
  fwd.run(direct, {req.system, test::iota_positions(req.system.size()), {}, {}});
  for (size_t i : nb) {
    const auto c = store.get(base_key(i));
    ASSERT_TRUE(c);
    direct.append_from(c->kv, 0, c->kv.size(), static_cast<int32_t>(direct.size()) - c->kv.position(0));
  }
  const size_t x = direct.size();
  const size_t n = chunks[0].tokens.size();
  fwd.run(direct, {chunks[0].tokens, test::iota_positions(n, static_cast<int32_t>(x)), {}, {}});
  const std::vector<size_t> last = {req.suffix.size() - 1};
  const auto out = fwd.run(direct, {req.suffix, test::iota_positions(req.suffix.size(), static_cast<int32_t>(x + n)), {}, last});

  ASSERT_EQ(got.cache.size(), direct.size());
  EXPECT_EQ(got.cache.positions(), direct.positions());
  const KvCache want = rows(direct, x, x + n);
  EXPECT_LE(max_kv_diff(rows(got.cache, x, x + n), want), 1e-6f) << "the chunk's K/V";
  ASSERT_EQ(got.logits.size(), out.logits.size());
  float dl = 0;
  for (size_t i = 0; i < out.logits.size(); ++i) dl = std::max(dl, std::abs(got.logits[i] - out.logits[i]));
  EXPECT_LE(dl, 1e-4f) << "first-token logits";

  // Served first in another request: its keys re-rotated to |S|. Moved back to where
  // enrichment computed them they differ by f16 rounding only; one position off, by far more.
  const RagRequest moved = build_rag_request(m, {passages[0], passages[3]}, question);
  const FusionResult got2 = ex.prefill(moved, opt);
  ASSERT_EQ(got2.selection_details["chunks"][0], "enriched");
  const size_t s = moved.system.size();
  EXPECT_EQ(got2.cache.position(s), static_cast<int32_t>(s));
  const int32_t back = static_cast<int32_t>(x) - static_cast<int32_t>(s);
  const float rounding = max_kv_diff(rows(got2.cache, s, s + n, back), want);
  const float off_by_one = max_kv_diff(rows(got2.cache, s, s + n, back + 1), want);
  EXPECT_LT(rounding, 0.01f * off_by_one) << rounding << " vs " << off_by_one;

  // sink "alone": the same enriched rows but the first, which is the chunk's first token
  // computed alone at position 0 (an alone cache's first row), moved to its place.
  FusionOptions sink = opt;
  sink.method_options = {{"sink", "alone"}};
  const FusionResult got3 = ex.prefill(req, sink);
  ASSERT_EQ(got3.selection_details["chunks"][2], "enriched+sink");
  EXPECT_LE(max_kv_diff(rows(got3.cache, x + 1, x + n), rows(want, 1, n)), 1e-6f);
  const ChunkCache alone = compute_chunk_cache(fwd, ChunkKey(m.fingerprint(), chunks[0].tokens));
  const float sink_rounding = max_kv_diff(rows(got3.cache, x, x + 1), rows(alone.kv, 0, 1, static_cast<int32_t>(x)));
  EXPECT_LE(sink_rounding, 1e-6f);
  EXPECT_GT(max_kv_diff(rows(got3.cache, x, x + 1), rows(want, 0, 1)), 1e-2f) << "the enriched first row differs";

  // enriched_layers (diagnostic): [0, 0) serves the base rows in every layer, i.e. reuse;
  // [0, L) is the enriched cache unchanged.
  FusionOptions none = opt, all = opt, reuse = opt;
  none.method_options = {{"enriched_layers", {0, 0}}};
  all.method_options = {{"enriched_layers", {0, h.n_layers}}};
  reuse.method = "reuse";
  const KvCache base_rows = rows(ex.prefill(req, reuse).cache, x, x + n);
  EXPECT_LE(max_kv_diff(rows(ex.prefill(req, none).cache, x, x + n), base_rows), 1e-6f);
  EXPECT_LE(max_kv_diff(rows(ex.prefill(req, all).cache, x, x + n), want), 1e-6f);
}

TEST_F(FusionRagOnline, EnrichedChunkAfterItsPicNeighboursEqualsComputingItThere) {
  expect_enriched_chunk_equals_computing_it_after_its_neighbours(ChunkContext::alone);
}

TEST_F(FusionRagOnline, EnrichedChunkAfterItsPrefixedNeighboursEqualsComputingItThere) {
  expect_enriched_chunk_equals_computing_it_after_its_neighbours(ChunkContext::prefixed);
}

TEST_F(FusionRagOnline, OptionsAreCheckedAndBothProbesChooseTheBudget) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const auto passages = test::fusionrag_corpus();
  const RagRequest req = build_rag_request(m, passages, "Where was Marie Curie born?");
  for (const char* bad : {R"({"sink": "yes"})", R"({"probe": 1})", R"({"neighbours": 3})",
                          R"({"enriched_layers": [3, 1]})", R"({"enriched_layers": 2})"}) {
    FusionOptions o{"fusionrag", 0.2, 0};
    o.method_options = nlohmann::json::parse(bad);
    EXPECT_THROW(ex.prefill(req, o), std::invalid_argument) << bad;
  }
  const size_t k = recompute_budget(0.2, req.context_tokens());
  std::vector<std::vector<size_t>> chosen;
  for (const char* probe : {"question", "stitched"}) {
    FusionOptions o{"fusionrag", 0.2, 0};
    o.method_options = {{"probe", probe}};
    const FusionResult r = ex.prefill(req, o);
    EXPECT_EQ(r.recomputed.size(), k) << probe;
    EXPECT_EQ(r.selection_details["probe"], probe);
    chosen.push_back(r.recomputed);
  }
  // The question alone and the question over the stitched chunks attend differently.
  EXPECT_NE(chosen[0], chosen[1]);
}

}  // namespace
}  // namespace cf

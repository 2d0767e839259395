// Cache-Craft: the formulas on hand-computed values, and on the real model the variant
// store, the variant choice (lowest CCI·(1-β')), the token ranking and the budget modes.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "../runtime/kv_rows.h"
#include "../runtime/model_fixture.h"
#include "fusion/executor.h"
#include "fusion/select_cachecraft.h"
#include "fusion_rig.h"
#include "runtime/sampler.h"

namespace cf {
namespace {
using namespace cachecraft;
using test::memory_store;

// ---- formulas -------------------------------------------------------------------------

TEST(CacheCraftFormulas, BetaIsTheSurvivingShareOfOldPrefixAttention) {
  const std::vector<PrefixSegment> old = {{"A", 4, 3.0}, {"B", 4, 1.0}, {"C", 4, 4.0}};
  EXPECT_DOUBLE_EQ(prefix_overlap_beta(old, {"B", "C", "X"}), 5.0 / 8.0);
  EXPECT_DOUBLE_EQ(prefix_overlap_beta(old, {"C", "B", "A"}), 1.0);  // order-invariant
  EXPECT_DOUBLE_EQ(prefix_overlap_beta(old, {"X"}), 0.0);
  EXPECT_DOUBLE_EQ(prefix_overlap_beta({}, {"A"}), 0.0);  // PIC: no old prefix
}

TEST(CacheCraftFormulas, GammaIsNormalizedKendallDistance) {
  const std::vector<PrefixSegment> old = {{"A", 1, 1}, {"B", 1, 1}, {"C", 1, 1}};
  // New order C A B: pairs (A,B) concordant, (A,C) and (B,C) discordant -> 2/3.
  EXPECT_DOUBLE_EQ(order_penalty_gamma(old, {"C", "A", "B"}), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(order_penalty_gamma(old, {"A", "X", "B", "C"}), 0.0);
  EXPECT_DOUBLE_EQ(order_penalty_gamma(old, {"C", "B", "A"}), 1.0);
  // The paper's example C1-C2-C3 vs C2-C1-C3, seen from C3: beta 1, gamma 1.
  const std::vector<PrefixSegment> c3 = {{"C1", 1, 2}, {"C2", 1, 1}};
  EXPECT_DOUBLE_EQ(prefix_overlap_beta(c3, {"C2", "C1"}), 1.0);
  EXPECT_DOUBLE_EQ(order_penalty_gamma(c3, {"C2", "C1"}), 1.0);
  EXPECT_DOUBLE_EQ(order_penalty_gamma(old, {"B"}), 0.0);  // m < 2
  EXPECT_DOUBLE_EQ(adjusted_overlap(0.8, 0.25), 0.6);
}

TEST(CacheCraftFormulas, CciAndCfo) {
  const std::vector<PrefixSegment> prefix = {{"A", 4, 2.0}, {"B", 2, 1.0}};
  const double a = contextualization_a(prefix, 5);  // 2/(5*4) + 1/(5*2)
  EXPECT_DOUBLE_EQ(a, 0.2);
  const double b = contextualization_b(2.5, 5);  // 2.5 / 25
  EXPECT_DOUBLE_EQ(b, 0.1);
  EXPECT_NEAR(cache_context_impact(a, b), 1.0 / (1.0 + std::exp(-2.0)), 1e-12);  // 0.880797
  EXPECT_DOUBLE_EQ(cache_context_impact(0.0, 0.3), 0.5);
  EXPECT_DOUBLE_EQ(cache_context_impact(0.0, 0.0), 0.5);
  EXPECT_DOUBLE_EQ(cache_context_impact(0.1, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(reuse_penalty(0.8, 0.5), 0.4);
  EXPECT_DOUBLE_EQ(cache_fix_overhead(2.0, 0.8, 0.5), 0.8);
  EXPECT_DOUBLE_EQ(cache_fix_overhead(3.0, 0.8, 0.5), 1.0);  // clamped
  EXPECT_DOUBLE_EQ(cache_fix_overhead(1.0, 0.9, 1.0), 0.0);  // exact prefix match
  EXPECT_EQ(cfo_token_counts(0.5, {0.5, 0.8, 0.0}, {8, 10, 6}), (std::vector<size_t>{2, 4, 0}));
  EXPECT_EQ(cfo_token_counts(0.5, {0.3}, {10}), (std::vector<size_t>{2}));  // ceil(1.5)
}

TEST(CacheCraftFormulas, GlobalBudgetIsSplitInProportionToCfo) {
  double alpha = 0;
  // 0.5a*10 + 0.25a*20 = 10a = 6 -> a = 0.6 -> quotas 3, 3, 0.
  EXPECT_EQ(allocate_budget(6, {0.5, 0.25, 0.0}, {10, 20, 10}, &alpha), (std::vector<size_t>{3, 3, 0}));
  EXPECT_NEAR(alpha, 0.6, 1e-9);
  const auto seven = allocate_budget(7, {0.5, 0.25, 0.0}, {10, 20, 10});
  EXPECT_EQ(std::accumulate(seven.begin(), seven.end(), size_t{0}), 7u);
  EXPECT_EQ(seven[2], 0u);
  // A chunk saturates at its size: 10 + 0.1a*10 = 12 -> a = 2.
  EXPECT_EQ(allocate_budget(12, {1.0, 0.1}, {10, 10}, &alpha), (std::vector<size_t>{10, 2}));
  EXPECT_NEAR(alpha, 2.0, 1e-6);
  // Beyond the chunks that need fixing, the rest goes to exact ones by size.
  EXPECT_EQ(allocate_budget(35, {0.5, 0.25, 0.0}, {10, 20, 10}), (std::vector<size_t>{10, 20, 5}));
  EXPECT_EQ(allocate_budget(40, {0.5, 0.25, 0.0}, {10, 20, 10}), (std::vector<size_t>{10, 20, 10}));
  EXPECT_EQ(allocate_budget(99, {0.0, 0.0}, {3, 5}), (std::vector<size_t>{3, 5}));
  EXPECT_EQ(allocate_budget(0, {0.5}, {10}), (std::vector<size_t>{0}));
}

TEST(CacheCraftFormulas, RankingAndFocusedChunks) {
  EXPECT_EQ(rank_tokens({0.1, 0.5, 0.5, 0.2}), (std::vector<uint32_t>{1, 2, 3, 0}));
  // Digest B2.4's table, "sensible" column: split at the largest gap.
  EXPECT_EQ(focused_chunk_count({10, 9, 3, 2, 1}), 2u);
  EXPECT_EQ(focused_chunk_count({1, 0.5, 10, 9.5, 9}), 3u);
  EXPECT_EQ(focused_chunk_count({10, 1, 0.9, 0.8, 0.7}), 1u);
  EXPECT_EQ(focused_chunk_count({4, 4, 4}), 3u);
}

TEST(CacheCraftFormulas, OptionsFromJson) {
  const auto o = CacheCraftOptions::from_json({{"alpha", 1.5}, {"own_budget", true}, {"max_variants", 2}});
  EXPECT_DOUBLE_EQ(o.alpha, 1.5);
  EXPECT_TRUE(o.own_budget);
  EXPECT_EQ(o.max_variants, 2u);
  EXPECT_THROW(CacheCraftOptions::from_json({{"alpah", 1}}), std::invalid_argument);
  EXPECT_THROW(CacheCraftOptions::from_json({{"alpha", -1}}), std::invalid_argument);
  // Wrong types and sizes are invalid_argument naming the option (a json type_error escaped
  // as a server error before, issue 59), and max_variants has a ceiling.
  for (const nlohmann::json& bad :
       {nlohmann::json{{"alpha", "x"}}, nlohmann::json{{"own_budget", 1}}, nlohmann::json{{"max_variants", -1}},
        nlohmann::json{{"max_variants", 2.5}}, nlohmann::json{{"max_variants", 1000000}},
        nlohmann::json{{"create_variants", "yes"}}, nlohmann::json{{"focus_window", 0}},
        nlohmann::json{{"focus_window", "3"}}}) {
    try {
      CacheCraftOptions::from_json(bad);
      ADD_FAILURE() << bad.dump() << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad.begin().key()), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(CacheCraftOptions::from_json({{"max_variants", 16}}).max_variants, 16u);
}

// ---- real model ------------------------------------------------------------------------

std::vector<Passage> corpus() {
  return {
      {"Marie Curie", "Marie Curie was a physicist and chemist who pioneered research on radioactivity."},
      {"Warsaw", "Warsaw is the capital of Poland. Marie Curie was born there in 1867."},
      {"Sorbonne", "The Sorbonne in Paris is where she studied and later became the first woman professor."},
      {"Pierre", "Pierre Curie, her husband, shared the 1903 Nobel Prize in physics with her."},
      {"Polonium", "She named the element polonium after her native country."},
  };
}

RagRequest request_of(const Model& m, std::initializer_list<size_t> order, const std::string& q) {
  const auto all = corpus();
  std::vector<Passage> ps;
  for (size_t i : order) ps.push_back(all[i]);
  return build_rag_request(m, ps, q);
}

class CacheCraft : public ::testing::Test {
 protected:
  void SetUp() override { CF_REQUIRE_MODEL(); }
};

const nlohmann::json& index_of(ChunkStore& store, const Model& m, const std::vector<TokenId>& chunk) {
  static std::shared_ptr<const ChunkCache> keep;
  keep = store.get(ChunkKey(m.fingerprint(), chunk));
  return keep->extra.at("cachecraft");
}

TEST_F(CacheCraft, VariantsCarryTheirPrefixAndAreMadeOncePerPrefix) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  const RagRequest r = request_of(m, {0, 1, 2}, "Where was Curie born?");
  const auto rep = build_cachecraft_variants(fwd, store, r);
  EXPECT_EQ(rep.created, 3u);
  EXPECT_GT(rep.forward_ms, 0.0);
  EXPECT_EQ(build_cachecraft_variants(fwd, store, r).created, 0u);  // same prefixes: nothing new

  // Chunk 2's variant lists chunks 0 and 1 as its old prefix, attended to.
  const auto& e = index_of(store, m, r.chunks[2]);
  ASSERT_EQ(e.at("variants").size(), 1u);
  const VariantStats st = VariantStats::from_json(e.at("variants")[0].at("stats"));
  ASSERT_EQ(st.prefix.size(), 2u);
  EXPECT_EQ(st.prefix[0].id, segment_id(m.fingerprint(), r.chunks[0]));
  EXPECT_GT(st.prefix[0].inter, 0.0);
  EXPECT_GT(st.cci, 0.5);
  EXPECT_LT(st.cci, 1.0);
  EXPECT_TRUE(e.contains("stats"));  // the PIC cache's own stats

  // Its K/V equal the full prefill's rows of that chunk (the variant is the chunk after its
  // true prefix), up to the store's f16 rounding.
  const auto v = store.get(ChunkKey(m.fingerprint(), r.chunks[2],
                                    KeyContext::after_prefix([&] {
                                      std::vector<TokenId> p = r.system;
                                      for (size_t j = 0; j < 2; ++j) p.insert(p.end(), r.chunks[j].begin(), r.chunks[j].end());
                                      return p;
                                    }())));
  ASSERT_TRUE(v);
  const auto toks = r.flatten();
  KvCache full(m.hparams(), toks.size());
  fwd.run(full, {toks, test::iota_positions(toks.size()), {}, {}});
  const size_t begin = r.system.size() + r.chunks[0].size() + r.chunks[1].size();
  EXPECT_EQ(v->kv.position(0), static_cast<int32_t>(begin));
  float d = 0;
  for (int l = 0; l < m.hparams().n_layers; l += 7) {
    const auto got = test::k_rows(v->kv, l, 0, v->n_tokens()), want = test::k_rows(full, l, begin, v->n_tokens());
    for (size_t i = 0; i < got.size(); ++i) d = std::max(d, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(d, 1e-5f);

  // M bounds the variants per chunk.
  CacheCraftOptions one;
  one.max_variants = 1;
  const RagRequest other = request_of(m, {3, 1, 2}, "Where was Curie born?");
  const auto rep2 = build_cachecraft_variants(fwd, store, other, one);
  EXPECT_EQ(rep2.created, 1u);  // chunk 3 (new); chunks 1 and 2 already hold one variant
  EXPECT_EQ(rep2.skipped_full, 2u);
}

// Issue 24: the attention statistics behind CCI (Cache-Craft §3.2, Eqs. 9-11) against a
// separately written computation. The variant builder recomputes each row's softmax from the
// tapped queries and the finished keys and sums it per prefix segment; here the forward pass's
// own captured probabilities are summed with plain loops and Eqs. 9-11 written out again.
TEST_F(CacheCraft, VariantStatisticsMatchAPlainRecomputation) {
  const Model& m = test::shared_model();
  const ModelHparams& h = m.hparams();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  const RagRequest r = request_of(m, {0, 1, 2}, "Where was Curie born?");
  ASSERT_EQ(build_cachecraft_variants(fwd, store, r).created, 3u);

  const std::vector<TokenId> toks = r.flatten();
  std::vector<size_t> begin{r.system.size()};  // begin[i]: first slot of chunk i; begin[3]: U
  for (const auto& c : r.chunks) begin.push_back(begin.back() + c.size());
  ForwardHooks hooks;
  hooks.capture_attention = true;
  for (size_t s = begin[0]; s < begin[3]; ++s) hooks.rows.push_back(s);
  // mass[row][segment]: 0 = S, 1..3 = chunks; self[row]: the row's own chunk, keys before it.
  std::vector<std::vector<double>> mass(hooks.rows.size(), std::vector<double>(4, 0.0));
  std::vector<double> self(hooks.rows.size(), 0.0);
  hooks.on_layer = [&](const LayerTap& t) {
    for (size_t ri = 0; ri < t.rows.size(); ++ri) {
      const size_t slot = t.rows[ri];
      size_t own = 0;
      while (slot >= begin[own + 1]) ++own;
      for (int hh = 0; hh < h.n_heads; ++hh) {
        const float* p = t.attn_probs + (ri * h.n_heads + hh) * t.n_entries;
        for (size_t e = 0; e < slot; ++e) {
          const size_t segment = e < begin[0] ? 0 : [&] { size_t c = 0; while (e >= begin[c + 1]) ++c; return c + 1; }();
          mass[ri][segment] += p[e];
          if (e >= begin[own]) self[ri] += p[e];
        }
      }
    }
  };
  KvCache full(h, toks.size());
  fwd.run(full, {toks, test::iota_positions(toks.size()), {}, {}}, &hooks);
  const double norm = static_cast<double>(h.n_heads) * h.n_layers;

  for (size_t i = 1; i < 3; ++i) {  // chunks with an old prefix of other chunks
    SCOPED_TRACE("chunk " + std::to_string(i));
    const size_t n = r.chunks[i].size();
    std::vector<double> inter(i, 0.0);
    double intra = 0;
    for (size_t t = 0; t < n; ++t) {
      const size_t ri = begin[i] + t - begin[0];
      for (size_t j = 0; j < i; ++j) inter[j] += mass[ri][j + 1] / norm;
      intra += self[ri] / norm;
    }
    double a = 0;
    for (size_t j = 0; j < i; ++j) a += inter[j] / (static_cast<double>(n) * static_cast<double>(r.chunks[j].size()));
    const double b = intra / (static_cast<double>(n) * static_cast<double>(n));
    const double cci = 1.0 / (1.0 + std::exp(-a / b));

    const auto& e = index_of(store, m, r.chunks[i]);
    ASSERT_EQ(e.at("variants").size(), 1u);
    const VariantStats st = VariantStats::from_json(e.at("variants")[0].at("stats"));
    ASSERT_EQ(st.prefix.size(), i);
    for (size_t j = 0; j < i; ++j) EXPECT_NEAR(st.prefix[j].inter, inter[j], 1e-3 * inter[j] + 1e-6) << "segment " << j;
    EXPECT_NEAR(st.intra, intra, 1e-3 * intra);
    EXPECT_NEAR(st.a_bar, a, 1e-3 * a);
    EXPECT_NEAR(st.b_bar, b, 1e-3 * b);
    EXPECT_NEAR(st.cci, cci, 1e-4);
  }
}

TEST_F(CacheCraft, TokensAreRankedByAttentionToTheOldPrefix) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  const RagRequest r = request_of(m, {0, 3, 4}, "Who named polonium?");
  build_cachecraft_variants(fwd, store, r);
  // Independent measurement: attention of chunk 2's tokens to chunks 0 and 1, mean over
  // heads and layers.
  const auto toks = r.flatten();
  const size_t b0 = r.system.size(), b2 = b0 + r.chunks[0].size() + r.chunks[1].size();
  const size_t n = r.chunks[2].size();
  std::vector<double> score(n, 0.0);
  ForwardHooks hooks;
  for (size_t t = 0; t < n; ++t) hooks.rows.push_back(b2 + t);
  hooks.capture_attention = true;
  hooks.on_layer = [&](const LayerTap& t) {
    for (size_t r = 0; r < n; ++r)
      for (int h = 0; h < m.hparams().n_heads; ++h)
        for (size_t e = b0; e < b2; ++e) score[r] += t.attn_probs[(r * m.hparams().n_heads + h) * t.n_entries + e];
  };
  KvCache kv(m.hparams(), toks.size());
  fwd.run(kv, {toks, test::iota_positions(toks.size()), {}, {}}, &hooks);
  const double norm = m.hparams().n_heads * m.hparams().n_layers;

  std::vector<TokenId> prefix = r.system;
  for (size_t j = 0; j < 2; ++j) prefix.insert(prefix.end(), r.chunks[j].begin(), r.chunks[j].end());
  const auto v = store.get(ChunkKey(m.fingerprint(), r.chunks[2], KeyContext::after_prefix(prefix)));
  ASSERT_TRUE(v);
  const auto rank = VariantStats::from_json(v->extra.at("cachecraft").at("stats")).rank;
  ASSERT_EQ(rank.size(), n);
  for (size_t i = 0; i + 1 < n; ++i) EXPECT_GE(score[rank[i]] / norm + 1e-6, score[rank[i + 1]] / norm) << i;
  std::vector<uint32_t> sorted = rank;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(sorted[i], i);  // a permutation

  // The PIC cache ranks its first token (the sink that stands in for the prefix) first.
  const auto pic = pic_stats(fwd, r.chunks[2]);
  EXPECT_EQ(pic.rank.at(0), 0u);
  EXPECT_DOUBLE_EQ(pic.cci, 0.5);
}

TEST_F(CacheCraft, PicksTheVariantWithLowestPenaltyAndRecomputesItsTopRankedTokens) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  // Two variants of chunk 2 ("Sorbonne"): after (0 1) and after (3 4).
  build_cachecraft_variants(fwd, store, request_of(m, {0, 1, 2}, "Q?"));
  build_cachecraft_variants(fwd, store, request_of(m, {3, 4, 2}, "Q?"));
  const RagRequest r = request_of(m, {4, 1, 2}, "Where did Curie study?");
  FusionOptions opt{"cachecraft", 0.3, 0};
  opt.method_options = {{"create_variants", false}};
  const FusionResult res = ex.prefill(r, opt);

  // Expected choice from the metadata store, by the formulas.
  const auto& e = index_of(store, m, r.chunks[2]);
  ASSERT_EQ(e.at("variants").size(), 2u);
  const std::vector<std::string> now = {segment_id(m.fingerprint(), r.chunks[0]), segment_id(m.fingerprint(), r.chunks[1])};
  double best = 0.5;
  std::string best_hash = hash128_hex(Hash128{});  // PIC
  for (const auto& v : e.at("variants")) {
    const auto st = VariantStats::from_json(v.at("stats"));
    const double bp = adjusted_overlap(prefix_overlap_beta(st.prefix, now), order_penalty_gamma(st.prefix, now));
    const double p = reuse_penalty(st.cci, bp);
    EXPECT_GT(prefix_overlap_beta(st.prefix, now), 0.0);  // each shares one chunk with the request
    EXPECT_LT(prefix_overlap_beta(st.prefix, now), 1.0);
    if (p <= best) best = p, best_hash = v.at("context_hash");
  }
  const auto& c2 = res.selection_details.at("chunks")[2];
  EXPECT_EQ(c2.at("context_hash"), best_hash);
  EXPECT_NEAR(c2.at("penalty").get<double>(), best, 1e-12);
  EXPECT_EQ(c2.at("variant"), best_hash == hash128_hex(Hash128{}) ? "pic" : "after_prefix");

  // Budget: exactly floor(0.3 N), and chunk 2's share is its top-ranked tokens.
  EXPECT_EQ(res.recomputed.size(), recompute_budget(0.3, r.context_tokens()));
  const size_t begin2 = r.system.size() + r.chunks[0].size() + r.chunks[1].size();
  std::shared_ptr<const ChunkCache> used =
      best_hash == hash128_hex(Hash128{})
          ? store.get(ChunkKey(m.fingerprint(), r.chunks[2]))
          : [&] {
              Hash128 h{};
              parse_hash128_hex(best_hash, h);
              return store.get(ChunkKey(m.fingerprint(), r.chunks[2], KeyContext{ContextKind::after_prefix, h}));
            }();
  const auto rank = VariantStats::from_json(used->extra.at("cachecraft").at("stats")).rank;
  const size_t n2 = c2.at("recomputed");
  EXPECT_GT(n2, 0u);
  std::vector<size_t> expect;
  for (size_t t = 0; t < n2; ++t) expect.push_back(begin2 + rank[t]);
  std::sort(expect.begin(), expect.end());
  std::vector<size_t> got;
  for (size_t s : res.recomputed)
    if (s >= begin2 && s < begin2 + r.chunks[2].size()) got.push_back(s);
  EXPECT_EQ(got, expect);
}

TEST_F(CacheCraft, OnlineVariantsAreOfflineWorkAndServeTheNextRequestExactly) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest r = request_of(m, {1, 0, 2}, "Where was Marie Curie born?");
  const FusionResult full = ex.prefill(r, {"full", 1.0, 0});
  const FusionResult reuse = ex.prefill(r, {"reuse", 0.0, 0});
  const FusionResult first = ex.prefill(r, {"cachecraft", 0.0, 0});
  EXPECT_EQ(first.selection_details.at("variants_created"), 3u);
  EXPECT_GT(first.timings.offline_ms, first.selection_details.at("variant_build_ms").get<double>() - 1e-9);
  float d_first = 0;
  for (size_t i = 0; i < reuse.logits.size(); ++i) d_first = std::max(d_first, std::fabs(first.logits[i] - reuse.logits[i]));
  EXPECT_LE(d_first, 1e-5f) << "the request that creates variants must not use them";

  // Same request again: every chunk finds its exact prefix (β' = 1, CFO = 0), so reuse
  // without recompute already matches full prefill.
  const FusionResult second = ex.prefill(r, {"cachecraft", 0.0, 0});
  EXPECT_EQ(second.selection_details.at("variants_created"), 0u);
  for (const auto& c : second.selection_details.at("chunks")) {
    EXPECT_EQ(c.at("variant"), "after_prefix");
    EXPECT_DOUBLE_EQ(c.at("cfo").get<double>(), 0.0);
  }
  float d = 0;
  for (size_t i = 0; i < full.logits.size(); ++i) d = std::max(d, std::fabs(second.logits[i] - full.logits[i]));
  EXPECT_LE(d, 1e-3f);
  EXPECT_EQ(argmax(second.logits.data(), second.logits.size()), argmax(full.logits.data(), full.logits.size()));
}

TEST_F(CacheCraft, OwnBudgetFollowsCfoAndRatioCapsIt) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest r = request_of(m, {2, 3, 4}, "What did Curie name polonium after?");
  FusionOptions opt{"cachecraft", 1.0, 0};
  opt.method_options = {{"own_budget", true}, {"alpha", 0.5}, {"create_variants", false}};
  const FusionResult own = ex.prefill(r, opt);
  // All PIC caches: CFO = 0.5 * 0.5 = 0.25 each, ceil per chunk.
  size_t expect = 0;
  for (const auto& c : r.chunks) expect += static_cast<size_t>(std::ceil(0.25 * static_cast<double>(c.size()) - 1e-9));
  EXPECT_EQ(own.recomputed.size(), expect);
  EXPECT_NEAR(own.selection_details.at("cfo_fraction").get<double>(),
              static_cast<double>(expect) / static_cast<double>(r.context_tokens()), 1e-12);
  opt.ratio = 0.1;  // below CFO's choice: the cap binds
  EXPECT_EQ(ex.prefill(r, opt).recomputed.size(), recompute_budget(0.1, r.context_tokens()));
  opt.method_options = {{"bogus", 1}};
  EXPECT_THROW(ex.prefill(r, opt), std::invalid_argument);
}

// Alg. 1 during the recompute pass: the focused set settles at some layer L*, the rows of the
// other chunks leave the pass after it (their deeper K/V stay the reused ones), and at ρ = 1
// nothing leaves, so the result still equals full prefill.
TEST_F(CacheCraft, FocusedChunkEarlyStopRetiresUnfocusedRowsAfterTheSettlingLayer) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest r = request_of(m, {0, 1, 2, 3, 4}, "Where was Marie Curie born?");
  FusionOptions opt{"cachecraft", 0.5, 0};
  opt.method_options = {{"create_variants", false}, {"focus_early_stop", true}, {"focus_window", 3}};
  const FusionResult on = ex.prefill(r, opt);
  ASSERT_TRUE(on.selection_details.contains("focus")) << on.selection_details.dump();
  const auto& focus = on.selection_details.at("focus");
  ASSERT_TRUE(focus.at("decided").get<bool>()) << focus.dump();
  const int layer = focus.at("layer").get<int>();
  EXPECT_GE(layer, 2);  // w = 3 layers of agreement at the earliest
  const auto focused = focus.at("focused_chunks").get<std::vector<size_t>>();
  EXPECT_GE(focused.size(), 1u);
  EXPECT_LT(focused.size(), r.chunks.size());
  // Exactly the recomputed rows of unfocused chunks left.
  size_t unfocused_rows = 0;
  size_t begin = r.system.size();
  for (size_t c = 0; c < r.chunks.size(); ++c) {
    const size_t end = begin + r.chunks[c].size();
    if (!std::binary_search(focused.begin(), focused.end(), c))
      for (size_t s : on.recomputed) unfocused_rows += (s >= begin && s < end);
    begin = end;
  }
  EXPECT_EQ(focus.at("rows_retired").get<size_t>(), unfocused_rows);
  EXPECT_GT(unfocused_rows, 0u);

  // Off: same selection, no focus report, different K/V above L* in an unfocused row.
  opt.method_options = {{"create_variants", false}};
  const FusionResult off = ex.prefill(r, opt);
  EXPECT_EQ(off.recomputed, on.recomputed);
  EXPECT_FALSE(off.selection_details.contains("focus"));

  // ρ = 1 with the option on: no early stop, full prefill's logits.
  opt.ratio = 1.0;
  opt.method_options = {{"create_variants", false}, {"focus_early_stop", true}};
  const FusionResult all = ex.prefill(r, opt);
  const FusionResult full = ex.prefill(r, {"full", 1.0, 0});
  EXPECT_FALSE(all.selection_details.contains("focus"));
  float worst = 0;
  for (size_t i = 0; i < full.logits.size(); ++i) worst = std::max(worst, std::fabs(all.logits[i] - full.logits[i]));
  EXPECT_LT(worst, 1e-4f);
  opt.method_options = {{"focus_window", 0}};
  EXPECT_THROW(ex.prefill(r, opt), std::invalid_argument);
}

}  // namespace
}  // namespace cf

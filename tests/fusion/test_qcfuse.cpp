// QCFuse: anchors (count, forced first tokens, order), the anchor-conditioned probe (leaves
// the stitched cache untouched), the selector's use of the critical-layer profile and its
// fallback, and a profile written from real calibration data read back unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "../runtime/model_fixture.h"
#include "fusion/executor.h"
#include "fusion/qcfuse.h"

namespace cf {
namespace {

namespace fs = std::filesystem;

std::vector<Passage> passages() {
  return {
      {"Marie Curie", "Marie Curie was a physicist and chemist who pioneered research on radioactivity. She won "
                      "Nobel Prizes in physics (1903) and chemistry (1911), the first person to win two."},
      {"Warsaw", "Warsaw is the capital and largest city of Poland. Marie Curie was born there in 1867, when the "
                 "city was part of the Russian Empire."},
      {"Sorbonne", "The Sorbonne in Paris is where Curie studied and later became the first woman professor."},
  };
}

ChunkStore memory_store(const Model& m) {
  ChunkStoreOptions o;
  o.model = StoreModel{m.fingerprint(), m.hparams()};
  return ChunkStore(o);
}

// A temporary directory as XDG_CACHE_HOME for one scope (the model is already loaded).
class ScopedCacheHome {
 public:
  ScopedCacheHome() {
    dir_ = fs::temp_directory_path() / ("cf_qcfuse_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    if (const char* old = std::getenv("XDG_CACHE_HOME")) old_ = old, had_ = true;
    ::setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
  }
  ~ScopedCacheHome() {
    if (had_)
      ::setenv("XDG_CACHE_HOME", old_.c_str(), 1);
    else
      ::unsetenv("XDG_CACHE_HOME");
    fs::remove_all(dir_);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
  std::string old_;
  bool had_ = false;
};

TEST(QcfuseAnchors, RankingKeepsCeilRatioForcesTheFirstFourAndIsAscending) {
  std::vector<double> score(95);
  for (size_t i = 0; i < score.size(); ++i) score[i] = static_cast<double>(i % 17);  // first four score low
  const auto a = qcfuse::rank_anchors(score, 0.1);
  ASSERT_EQ(a.size(), 10u);  // ceil(9.5)
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(a[i], i);
  double weakest_kept = 1e9;
  for (size_t i = 4; i < a.size(); ++i) weakest_kept = std::min(weakest_kept, score[a[i]]);
  EXPECT_EQ(weakest_kept, 15.0);
  for (uint32_t i = 4; i < score.size(); ++i)
    if (!std::binary_search(a.begin(), a.end(), i)) {
      EXPECT_LE(score[i], weakest_kept) << "a better position left out";
    }
  EXPECT_EQ(qcfuse::rank_anchors(score, 0.0).size(), 0u);
  EXPECT_EQ(qcfuse::rank_anchors(score, 1.0).size(), 95u);
  EXPECT_EQ(qcfuse::rank_anchors(std::vector<double>(3, 1.0), 0.5), (std::vector<uint32_t>{0, 1}));
  EXPECT_THROW(qcfuse::anchor_count(10, 1.5), std::invalid_argument);
}

class Qcfuse : public ::testing::Test {
 protected:
  void SetUp() override { CF_REQUIRE_MODEL(); }
};

TEST_F(Qcfuse, AnchorsOfARealChunkAreStoredAndRecognised) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  ChunkCache c = compute_chunk_cache(fwd, ChunkKey(m.fingerprint(), req.chunks[0]));
  const size_t n = c.n_tokens();
  ASSERT_GT(n, 30u);
  const std::vector<double> s = qcfuse::kvzip_scores(fwd, c.kv);
  ASSERT_EQ(s.size(), n);
  for (double x : s) EXPECT_TRUE(x >= 0.0 && x <= m.hparams().n_layers);
  EXPECT_GT(*std::max_element(s.begin(), s.end()), *std::min_element(s.begin(), s.end()));

  EXPECT_FALSE(qcfuse::stored_anchors(c).has_value());
  qcfuse::prepare_anchors(fwd, c);
  const auto a = qcfuse::stored_anchors(c);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->size(), static_cast<size_t>(std::ceil(0.1 * static_cast<double>(n))));
  EXPECT_TRUE(std::is_sorted(a->begin(), a->end()));
  EXPECT_EQ(std::adjacent_find(a->begin(), a->end()), a->end());
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ((*a)[i], i);
  EXPECT_EQ(*a, qcfuse::rank_anchors(s, 0.1));
  const auto a2 = qcfuse::stored_anchors(c, 0.2);
  ASSERT_TRUE(a2.has_value()) << "other ratios come from the stored ranking";
  EXPECT_EQ(*a2, qcfuse::rank_anchors(s, 0.2));
  EXPECT_TRUE(std::includes(a2->begin(), a2->end(), a->begin(), a->end()));
  EXPECT_EQ(c.extra["qcfuse"]["anchors"].get<std::vector<uint32_t>>(), *a);
  ChunkCache damaged = c;
  damaged.extra["qcfuse"]["ranking"].erase(0);
  EXPECT_FALSE(qcfuse::stored_anchors(damaged).has_value()) << "a ranking of the wrong length is not served";

  // The selector asks for them exactly when they are missing.
  auto sel = make_selector("qcfuse");
  EXPECT_FALSE(sel->needs_preparation(c));
  c.extra.erase("qcfuse");
  EXPECT_TRUE(sel->needs_preparation(c));
}

TEST_F(Qcfuse, ProbeLeavesTheStitchedCacheUntouchedAndScoresEveryPosition) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  const std::vector<TokenId> all = req.flatten();
  const size_t cb = req.system.size(), ce = cb + req.context_tokens();
  KvCache stitched(m.hparams(), all.size());
  const auto pos = test::iota_positions(ce);
  fwd.run(stitched, {std::span<const TokenId>(all).first(ce), pos, {}, {}});
  const KvCache before = stitched;
  const std::vector<size_t> anchors{cb, cb + 1, cb + 2, cb + 7, ce - 3};
  const auto r = qcfuse::anchor_probe(fwd, stitched, cb, ce, anchors, req.suffix, {4, 11});
  ASSERT_EQ(r.scores.size(), 2u);
  EXPECT_EQ(r.anchor_entries, anchors.size());
  ASSERT_EQ(stitched.size(), before.size());
  for (int l = 0; l < m.hparams().n_layers; ++l)
    EXPECT_EQ(std::memcmp(stitched.k_f16(l, 0), before.k_f16(l, 0), ce * stitched.kv_dim() * KvCache::kValueBytes), 0);
  for (const auto& s : r.scores) {
    ASSERT_EQ(s.size(), ce - cb);
    // Summed over heads and U tokens: each (token, head) spreads at most 1 over the context.
    const double total = std::accumulate(s.begin(), s.end(), 0.0);
    EXPECT_GT(total, 0.0);
    EXPECT_LE(total, static_cast<double>(req.suffix.size() * m.hparams().n_heads) + 1e-6);
    for (double x : s) EXPECT_GE(x, 0.0);
  }
  EXPECT_NE(r.scores[0], r.scores[1]);
  EXPECT_THROW(qcfuse::anchor_probe(fwd, stitched, cb, ce, anchors, req.suffix, {99}), std::invalid_argument);
}

// A fresh install (empty cache) runs with the profile shipped for the model
// (data/qcfuse_profiles); a profile in the cache (chunkfuse profile-layers) takes precedence.
TEST_F(Qcfuse, SelectorUsesTheCachedProfileElseTheBundledOne) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  FusionExecutor ex(fwd, store);
  const RagRequest req = build_rag_request(m, passages(), "Which prizes did Curie win?");
  ScopedCacheHome home;

  std::string where;
  const auto bundled = qcfuse::bundled_profile(m.fingerprint_hex(), &where);
  ASSERT_TRUE(bundled.has_value()) << "no profile in data/qcfuse_profiles for the default model " << m.fingerprint_hex();
  EXPECT_EQ(where, "data/qcfuse_profiles/" + m.fingerprint_hex() + ".qcfuse.json");
  EXPECT_EQ(bundled->critical_layers.size(), 3u);
  EXPECT_EQ(bundled->recall.size(), static_cast<size_t>(m.hparams().n_layers));
  EXPECT_FALSE(qcfuse::bundled_profile("0123456789abcdef").has_value());

  const FusionResult fb = ex.prefill(req, {"qcfuse", 0.15, 0});
  EXPECT_EQ(fb.recomputed.size(), recompute_budget(0.15, req.context_tokens()));
  EXPECT_EQ(fb.cache.size(), req.flatten().size()) << "probe entries left behind";
  EXPECT_EQ(fb.selection_details.at("critical_layers"), nlohmann::json(bundled->critical_layers));
  EXPECT_EQ(fb.selection_details.at("layers_source").get<std::string>(), "bundled " + where);
  size_t expect_anchors = 0;
  for (const auto& c : req.chunks) expect_anchors += qcfuse::anchor_count(c.size(), 0.1);
  EXPECT_EQ(fb.selection_details.at("anchors").get<size_t>(), expect_anchors);
  EXPECT_EQ(fb.selection_details.at("anchors_computed_online").get<size_t>(), 0u) << "prepared offline";

  qcfuse::LayerProfile p;
  p.model_fingerprint = m.fingerprint_hex();
  p.recall.assign(m.hparams().n_layers, 0.1);
  p.critical_layers = {7, 3, 12};
  qcfuse::save_profile(p, qcfuse::default_profile_path(m.fingerprint_hex()));
  const FusionResult pr = ex.prefill(req, {"qcfuse", 0.15, 0});
  EXPECT_EQ(pr.selection_details.at("critical_layers"), nlohmann::json({7, 3, 12}));
  EXPECT_EQ(pr.selection_details.at("probe_depth").get<int>(), 13);
  EXPECT_EQ(pr.recomputed.size(), fb.recomputed.size());
  EXPECT_NE(pr.recomputed, fb.recomputed) << "other layers should rank differently";
}

TEST_F(Qcfuse, MethodOptionsSetTheLayersAndTheAnchorRatio) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  FusionExecutor ex(fwd, store);
  const RagRequest req = build_rag_request(m, passages(), "Which prizes did Curie win?");
  FusionOptions o{"qcfuse", 0.2, 0};
  o.method_options = {{"layers", {2, 9}}, {"anchor_ratio", 0.0}};
  const FusionResult r = ex.prefill(req, o);
  EXPECT_EQ(r.selection_details.at("critical_layers"), nlohmann::json({2, 9}));
  EXPECT_EQ(r.selection_details.at("anchors").get<size_t>(), 0u) << "query-only probing";
  EXPECT_EQ(r.recomputed.size(), recompute_budget(0.2, req.context_tokens()));
  o.method_options = {{"anchor_ratio", 0.3}};
  const FusionResult r3 = ex.prefill(req, o);
  size_t expect = 0;
  for (const auto& c : req.chunks) expect += qcfuse::anchor_count(c.size(), 0.3);
  EXPECT_EQ(r3.selection_details.at("anchors").get<size_t>(), expect);
  o.method_options = {{"layers", {99}}};
  EXPECT_THROW(ex.prefill(req, o), std::invalid_argument);
  o.method_options = {{"depth", 3}};
  EXPECT_THROW(ex.prefill(req, o), std::invalid_argument);
}

TEST(QcfuseProfile, JsonRoundTripAndRejectsBadFiles) {
  qcfuse::LayerProfile p;
  p.model_fingerprint = "00ff";
  p.recall = {0.1, 0.5, 0.3};
  p.critical_layers = {1, 2};
  p.critical_set_recall = 0.55;
  p.seconds = 1.5;
  p.data = {{"x", 1}};
  const std::string path = (fs::temp_directory_path() / ("cf_qcfuse_prof_" + std::to_string(::getpid()) + ".json")).string();
  qcfuse::save_profile(p, path);
  const auto q = qcfuse::load_profile(path);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(qcfuse::profile_to_json(*q), qcfuse::profile_to_json(p));
  auto bad = qcfuse::profile_to_json(p);
  bad["critical_layers"] = {5};
  EXPECT_THROW(qcfuse::profile_from_json(bad), std::runtime_error);
  bad.erase("recall_at_10pct");
  EXPECT_THROW(qcfuse::profile_from_json(bad), std::runtime_error);
  fs::remove(path);
  EXPECT_FALSE(qcfuse::load_profile(path).has_value());
}

TEST_F(Qcfuse, GoldSpansMapToTheTokensThatSpellThem) {
  const Model& m = test::shared_model();
  const Passage p{"France", "The capital of France is Paris, on the Seine."};
  const std::string text = passage_text(p, {});
  const auto toks = m.tokenizer().encode(text, false, false);
  const size_t at = text.find("Paris");
  std::vector<size_t> gold;
  ASSERT_TRUE(qcfuse::gold_token_positions(m.tokenizer(), toks, text, {{at, at + 5}}, gold));
  ASSERT_FALSE(gold.empty());
  std::string spelled;
  for (size_t t : gold) spelled += m.tokenizer().token_to_piece(toks[t], false);
  EXPECT_NE(spelled.find("Paris"), std::string::npos);
  EXPECT_LE(spelled.size(), 8u);
  EXPECT_FALSE(qcfuse::gold_token_positions(m.tokenizer(), toks, text + "x", {{at, at + 5}}, gold));
}

TEST_F(Qcfuse, ProfileFromCalibrationDataRoundTrips) {
  const std::string dir = std::string(CHUNKFUSE_SOURCE_DIR) + "/../shared/datasets";
  if (!fs::exists(dir + "/hotpotqa_dev200.jsonl") || !fs::exists(dir + "/nq_open_oracle.jsonl.gz"))
    GTEST_SKIP() << "calibration data not found in " << dir;
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStore store = memory_store(m);
  auto examples = qcfuse::read_nq_calibration(dir + "/nq_open_oracle.jsonl.gz", 2);
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].passages.size(), 2u) << "gold + the other example's passage";
  for (auto& e : qcfuse::read_hotpot_calibration(dir + "/hotpotqa_dev200.jsonl", 1)) {
    EXPECT_EQ(e.index, 199u) << "calibration takes the last examples";
    examples.push_back(std::move(e));
  }
  size_t progress_calls = 0;
  qcfuse::ProfileOptions opt;
  opt.progress = [&](size_t done, size_t total, const qcfuse::CalibrationExample&, size_t) {
    ++progress_calls;
    EXPECT_LE(done, total);
  };
  const qcfuse::LayerProfile p = qcfuse::profile_critical_layers(fwd, store, examples, opt);
  EXPECT_EQ(progress_calls, examples.size());
  ASSERT_EQ(p.recall.size(), static_cast<size_t>(m.hparams().n_layers));
  for (double r : p.recall) EXPECT_TRUE(r >= 0.0 && r <= 1.0);
  ASSERT_EQ(p.critical_layers.size(), 3u);
  EXPECT_GE(p.recall[p.critical_layers[0]], p.recall[p.critical_layers[1]]);
  EXPECT_GE(p.recall[p.critical_layers[1]], p.recall[p.critical_layers[2]]);
  EXPECT_GE(p.recall[p.critical_layers[2]], *std::min_element(p.recall.begin(), p.recall.end()));
  EXPECT_GT(*std::max_element(p.recall.begin(), p.recall.end()), 0.0) << "some layer must find some evidence";
  EXPECT_GE(p.all_layers_recall, 0.0);
  EXPECT_LE(p.critical_set_recall, 1.0);
  EXPECT_GT(p.seconds, 0.0);
  EXPECT_EQ(p.data.at("datasets").size(), 2u);

  const std::string path = (fs::temp_directory_path() / ("cf_qcfuse_real_" + std::to_string(::getpid()) + ".json")).string();
  qcfuse::save_profile(p, path);
  const auto q = qcfuse::load_profile(path);
  fs::remove(path);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->critical_layers, p.critical_layers);
  EXPECT_EQ(qcfuse::profile_to_json(*q), qcfuse::profile_to_json(p));
}

}  // namespace
}  // namespace cf

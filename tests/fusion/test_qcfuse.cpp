// QCFuse: anchors (count, forced first tokens, order), the anchor-conditioned probe (leaves
// the stitched cache untouched), the selector's use of the critical-layer profile and its
// fallback, and a profile written from real calibration data read back unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <optional>
#include <set>

#include "../runtime/model_fixture.h"
#include "fusion/methods.h"
#include "fusion/executor.h"
#include "fusion/qcfuse.h"
#include "fusion_rig.h"

namespace cf {
namespace {

namespace fs = std::filesystem;
using test::memory_store;

std::vector<Passage> passages() {
  return {
      {"Marie Curie", "Marie Curie was a physicist and chemist who pioneered research on radioactivity. She won "
                      "Nobel Prizes in physics (1903) and chemistry (1911), the first person to win two."},
      {"Warsaw", "Warsaw is the capital and largest city of Poland. Marie Curie was born there in 1867, when the "
                 "city was part of the Russian Empire."},
      {"Sorbonne", "The Sorbonne in Paris is where Curie studied and later became the first woman professor."},
  };
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

// The shared (one set per chunk) view holds exactly ceil(0.1 n) anchors of each chunk.
void o_shared_check(FusionExecutor& ex, const RagRequest& req, size_t expect_anchors) {
  FusionOptions o{"qcfuse", 0.15, 0};
  o.method_options = {{"anchors", "shared"}};
  const FusionResult r = ex.prefill(req, o);
  EXPECT_EQ(r.selection_details.at("anchors").get<size_t>(), expect_anchors);
  EXPECT_EQ(r.selection_details.at("anchor_rule"), "sink_shared");
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

  EXPECT_FALSE(qcfuse::stored_anchors(c, 0.1).has_value());
  const qcfuse::AnchorRule plain_shared{false, false};
  qcfuse::prepare_anchors(fwd, c, plain_shared);
  const auto a = qcfuse::stored_anchors(c, 0.1, plain_shared);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->size(), static_cast<size_t>(std::ceil(0.1 * static_cast<double>(n))));
  EXPECT_TRUE(std::is_sorted(a->begin(), a->end()));
  EXPECT_EQ(std::adjacent_find(a->begin(), a->end()), a->end());
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ((*a)[i], i);
  EXPECT_EQ(*a, qcfuse::rank_anchors(s, 0.1));
  const auto a2 = qcfuse::stored_anchors(c, 0.2, plain_shared);
  ASSERT_TRUE(a2.has_value()) << "other ratios come from the stored ranking";
  EXPECT_EQ(*a2, qcfuse::rank_anchors(s, 0.2));
  EXPECT_TRUE(std::includes(a2->begin(), a2->end(), a->begin(), a->end()));
  EXPECT_FALSE(qcfuse::stored_anchors(c, 0.1).has_value()) << "the default rule (sinks) was not prepared";

  // The default rule: sink keys in the softmax, one set per layer from that layer's scores.
  qcfuse::prepare_anchors(fwd, c);
  const KvCache* sinks = qcfuse::sink_keys(fwd, qcfuse::AnchorRule{});
  ASSERT_NE(sinks, nullptr);
  EXPECT_EQ(sinks->size(), qcfuse::kSinkKeys);
  const auto by_layer = qcfuse::kvzip_layer_scores(fwd, c.kv, sinks);
  ASSERT_EQ(by_layer.size(), static_cast<size_t>(m.hparams().n_layers));
  EXPECT_NE(by_layer[3], qcfuse::kvzip_layer_scores(fwd, c.kv, nullptr)[3]) << "sink keys take attention mass";
  std::set<std::vector<uint32_t>> distinct;
  for (int l = 0; l < m.hparams().n_layers; ++l) {
    const auto al = qcfuse::stored_anchors(c, 0.1, {}, l);
    ASSERT_TRUE(al.has_value()) << "layer " << l;
    EXPECT_EQ(*al, qcfuse::rank_anchors(by_layer[static_cast<size_t>(l)], 0.1)) << "layer " << l;
    for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ((*al)[i], i);
    distinct.insert(*al);
  }
  EXPECT_GT(distinct.size(), 1u) << "layers rank differently";
  EXPECT_FALSE(qcfuse::stored_anchors(c, 0.1, {}, m.hparams().n_layers).has_value());
  ASSERT_TRUE(qcfuse::stored_anchors(c, 0.1, plain_shared).has_value()) << "preparing one rule keeps the other";
  ChunkCache damaged = c;
  damaged.extra["qcfuse"]["sink"]["layers"][2].erase(0);
  EXPECT_FALSE(qcfuse::stored_anchors(damaged, 0.1, {}, 2).has_value()) << "a ranking of the wrong length is not served";

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
  qcfuse::ProbeView view;
  view.anchors = {anchors};
  const size_t nu = req.suffix.size();
  const auto r = qcfuse::query_probe(fwd, stitched, cb, ce, view, req.suffix, 0, nu, {4, 11});
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
    EXPECT_LE(total, static_cast<double>(nu * m.hparams().n_heads) + 1e-6);
    for (double x : s) EXPECT_GE(x, 0.0);
  }
  EXPECT_NE(r.scores[0], r.scores[1]);
  EXPECT_THROW(qcfuse::query_probe(fwd, stitched, cb, ce, view, req.suffix, 0, nu, {99}), std::invalid_argument);

  // Per-layer sets: the same set at every layer is the shared view; another set at one layer
  // changes the probe from that layer on, not before.
  qcfuse::ProbeView same;
  same.anchors.assign(12, anchors);
  EXPECT_EQ(qcfuse::query_probe(fwd, stitched, cb, ce, same, req.suffix, 0, nu, {4, 11}).scores, r.scores);
  // The changed set is a subset of the others, so the compact cache is the same and the
  // layers before it compute the same bits (new entries would change attention's summation
  // order, noise that the per-block activation scales pass on to every later layer).
  qcfuse::ProbeView other = same;
  other.anchors[6] = {cb, cb + 2, ce - 3};
  const auto ro = qcfuse::query_probe(fwd, stitched, cb, ce, other, req.suffix, 0, nu, {4, 11});
  EXPECT_EQ(ro.scores[0], r.scores[0]) << "layer 4 is before the changed layer";
  EXPECT_NE(ro.scores[1], r.scores[1]);
  EXPECT_EQ(ro.anchor_entries, 5u);
  // New entries hidden from every layer but 6: the union grows to 7.
  qcfuse::ProbeView wider = same;
  wider.anchors[6] = {cb, cb + 1, cb + 2, cb + 3, cb + 20};
  EXPECT_EQ(qcfuse::query_probe(fwd, stitched, cb, ce, wider, req.suffix, 0, nu, {4, 11}).anchor_entries, 7u);

  // Question rows: U is cut after the question; the rows score alone.
  ASSERT_GT(req.question_end, req.question_begin);
  const auto rq = qcfuse::query_probe(fwd, stitched, cb, ce, view, req.suffix, req.question_begin, req.question_end, {4});
  EXPECT_LE(std::accumulate(rq.scores[0].begin(), rq.scores[0].end(), 0.0),
            static_cast<double>((req.question_end - req.question_begin) * m.hparams().n_heads) + 1e-6);
  EXPECT_NE(rq.scores[0], r.scores[0]);
  EXPECT_EQ(stitched.size(), before.size());
}

TEST_F(Qcfuse, QuestionRowsSpellTheQuestionOnly) {
  const Model& m = test::shared_model();
  const std::string q = "Where was Marie Curie born?";
  const RagRequest req = build_rag_request(m, passages(), q);
  ASSERT_LT(req.question_begin, req.question_end);
  ASSERT_LT(req.question_end, req.suffix.size()) << "the template tail follows the question";
  std::string spelled;
  for (size_t t = req.question_begin; t < req.question_end; ++t) spelled += m.tokenizer().token_to_piece(req.suffix[t], false);
  EXPECT_NE(spelled.find("Marie Curie born?"), std::string::npos) << spelled;
  EXPECT_EQ(spelled.find("Question"), std::string::npos) << spelled;
  EXPECT_LE(spelled.size(), q.size() + 1) << spelled;
  EXPECT_EQ(qcfuse::probe_row_range(req, qcfuse::ProbeRows::suffix), std::make_pair(size_t{0}, req.suffix.size()));
  RagRequest chat = req;
  chat.question_begin = chat.question_end = 0;  // a suffix built elsewhere: all of U
  EXPECT_EQ(qcfuse::probe_row_range(chat, qcfuse::ProbeRows::question), std::make_pair(size_t{0}, req.suffix.size()));
}

// Issue 16: QCFuse with anchor ratio 1 and all layers is the full-view selector, so it must
// choose exactly ProphetKV's positions, on real multi-hop examples, both probe-row modes.
TEST_F(Qcfuse, AnchorRatioOneWithAllLayersSelectsExactlyProphetsPositionsSlow) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  std::vector<std::pair<std::vector<Passage>, std::string>> cases{{passages(), "Which prizes did Curie win?"}};
  const std::string hotpot = test::shared_datasets_dir() + "/hotpotqa_dev200.jsonl";
  if (fs::exists(hotpot))
    for (auto& e : qcfuse::read_hotpot_calibration(hotpot, 2)) cases.emplace_back(e.passages, e.question);
  for (const auto& [ps, q] : cases) {
    const RagRequest req = build_rag_request(m, ps, q);
    for (const char* rows : {"question", "suffix"})
      for (double ratio : {0.3}) {
        FusionOptions p{"prophet", ratio, 0};
        p.method_options = {{"probe_rows", rows}};
        FusionOptions c{"qcfuse", ratio, 0};
        c.method_options = {{"anchor_ratio", 1.0}, {"layers", "all"}, {"probe_rows", rows}};
        const FusionResult rp = ex.prefill(req, p), rc = ex.prefill(req, c);
        EXPECT_EQ(rc.recomputed, rp.recomputed) << q << " rows " << rows << " ratio " << ratio;
        EXPECT_EQ(rc.recomputed.size(), recompute_budget(ratio, req.context_tokens()));
        EXPECT_EQ(rc.logits, rp.logits);
      }
    FusionOptions c{"qcfuse", 0.3, 0};  // the compressed view does differ
    const FusionResult rd = ex.prefill(req, c), rp = ex.prefill(req, {"prophet", 0.3, 0});
    EXPECT_NE(rd.recomputed, rp.recomputed) << q;
  }
  // Without the data only the built-in case ran: a reported skip, not a silent pass (issue 24).
  if (!fs::exists(hotpot)) GTEST_SKIP() << "calibration data not found (" << hotpot << "): only the built-in case ran";
  EXPECT_EQ(cases.size(), 3u);
}

// A profile made for another model is refused, never used: by name of file (an error naming
// it) and in the cache (the shipped profile is used instead, and details say why).
TEST_F(Qcfuse, AProfileOfAnotherModelIsRefused) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest req = build_rag_request(m, passages(), "Which prizes did Curie win?");
  ScopedCacheHome home;
  qcfuse::LayerProfile p;
  p.model_fingerprint = "0123456789abcdef";
  p.recall.assign(m.hparams().n_layers, 0.1);
  p.critical_layers = {7, 3, 12};
  const std::string file = (home.dir() / "other.qcfuse.json").string();
  qcfuse::save_profile(p, file);
  FusionOptions o{"qcfuse", 0.15, 0};
  o.method_options = {{"profile", file}};
  try {
    ex.prefill(req, o);
    ADD_FAILURE() << "a profile of another model was used";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("0123456789abcdef"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not of this model"), std::string::npos) << e.what();
  }
  qcfuse::save_profile(p, qcfuse::default_profile_path(m.fingerprint_hex()));
  const FusionResult r = ex.prefill(req, {"qcfuse", 0.15, 0});
  EXPECT_NE(r.selection_details.at("critical_layers"), nlohmann::json({7, 3, 12}));
  EXPECT_EQ(r.selection_details.at("layers_source").get<std::string>().rfind("bundled ", 0), 0u)
      << r.selection_details.at("layers_source");
  p.model_fingerprint = m.fingerprint_hex();
  qcfuse::save_profile(p, file);
  EXPECT_EQ(ex.prefill(req, o).selection_details.at("critical_layers"), nlohmann::json({7, 3, 12}));
  // The shipped targets are reachable by name.
  o.method_options = {{"profile", "evidence"}};
  const auto ev = qcfuse::bundled_profile(m.fingerprint_hex(), nullptr, "evidence");
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ex.prefill(req, o).selection_details.at("critical_layers"), nlohmann::json(ev->critical_layers));
}

// A request much longer than every prompt its profile was fitted on is said in the details
// (profile-layers records the lengths); a profile without them, or a request within twice the
// longest, says nothing.
TEST_F(Qcfuse, SaysWhenARequestIsFarLongerThanTheProfilesPrompts) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest req = build_rag_request(m, passages(), "Which prizes did Curie win?");
  const size_t n = req.context_tokens();
  ASSERT_GT(n, 6u);
  ScopedCacheHome home;
  qcfuse::LayerProfile p;
  p.model_fingerprint = m.fingerprint_hex();
  p.recall.assign(m.hparams().n_layers, 0.1);
  p.critical_layers = {7, 3, 12};
  const std::string file = (home.dir() / "lengths.qcfuse.json").string();
  FusionOptions o{"qcfuse", 0.15, 0};
  o.method_options = {{"profile", file}};
  auto details_with_max = [&](std::optional<size_t> max) {
    p.data = nlohmann::json::object();
    if (max) p.data["context_tokens"] = {{"min", *max / 2}, {"median", *max / 2}, {"max", *max}};
    qcfuse::save_profile(p, file);
    return ex.prefill(req, o).selection_details;
  };
  const auto shorter = details_with_max(n / 3);
  ASSERT_TRUE(shorter.contains("profile_note")) << shorter.dump();
  const std::string note = shorter.at("profile_note").get<std::string>();
  EXPECT_NE(note.find("at most " + std::to_string(n / 3) + " context tokens"), std::string::npos) << note;
  EXPECT_NE(note.find("this one has " + std::to_string(n)), std::string::npos) << note;
  EXPECT_NE(note.find("profile-layers --data"), std::string::npos) << note;
  EXPECT_EQ(shorter.at("profile_max_context_tokens").get<size_t>(), n / 3);
  EXPECT_EQ(shorter.at("critical_layers"), nlohmann::json({7, 3, 12})) << "a note, not a refusal";
  const auto within = details_with_max(n / 2 + 1);  // n <= 2 * max
  EXPECT_FALSE(within.contains("profile_note")) << within.dump();
  EXPECT_EQ(within.at("profile_max_context_tokens").get<size_t>(), n / 2 + 1);
  const auto unrecorded = details_with_max(std::nullopt);
  EXPECT_FALSE(unrecorded.contains("profile_note"));
  EXPECT_FALSE(unrecorded.contains("profile_max_context_tokens"));
}

// A fresh install (empty cache) runs with the profile shipped for the model
// (data/qcfuse_profiles); a profile in the cache (chunkfuse profile-layers) takes precedence.
TEST_F(Qcfuse, SelectorUsesTheCachedProfileElseTheBundledOne) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
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
  // Per-layer sets: their union is in the compact cache, each layer sees ceil(0.1 n) per chunk.
  EXPECT_GE(fb.selection_details.at("anchors").get<size_t>(), expect_anchors);
  EXPECT_EQ(fb.selection_details.at("anchor_rule"), "sink_per_layer");
  o_shared_check(ex, req, expect_anchors);
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
  // The cached profile's layers are used as such: the same set as naming them in the
  // options, and the bundled profile's set as naming its layers. (Whether a set ranks the
  // right tokens is SelectorReference's: tests/fusion/test_selector_reference.cpp.)
  FusionOptions named{"qcfuse", 0.15, 0};
  named.method_options = {{"layers", {7, 3, 12}}};
  EXPECT_EQ(ex.prefill(req, named).recomputed, pr.recomputed);
  named.method_options = {{"layers", bundled->critical_layers}};
  EXPECT_EQ(ex.prefill(req, named).recomputed, fb.recomputed);
}

TEST_F(Qcfuse, MethodOptionsSetTheLayersAndTheAnchorRatio) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
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
  EXPECT_GE(r3.selection_details.at("anchors").get<size_t>(), expect);
  o.method_options = {{"anchor_ratio", 0.3}, {"anchors", "shared"}};
  EXPECT_EQ(ex.prefill(req, o).selection_details.at("anchors").get<size_t>(), expect) << "one set per chunk";
  // Bad options: an error naming the option, for every option of both selectors.
  const std::vector<std::pair<std::string, nlohmann::json>> bad{
      {"qcfuse", {{"layers", {99}}}},
      {"qcfuse", {{"depth", 3}}},
      {"qcfuse", {{"anchor_ratio", 1.5}}},
      {"qcfuse", {{"anchor_ratio", "lots"}}},
      {"qcfuse", {{"anchors", "per_chunk"}}},
      {"qcfuse", {{"anchor_sinks", 1}}},
      {"qcfuse", {{"probe_rows", "template"}}},
      {"qcfuse", {{"layers", "first"}}},
      {"qcfuse", {{"layers", {-1}}}},
      {"qcfuse", {{"profile", ""}}},
      {"qcfuse", {{"profile", "/nonexistent/profile.json"}}},
      {"prophet", {{"probe_rows", "all"}}},
      {"prophet", {{"anchor_ratio", 0.1}}},
  };
  for (const auto& [method, opts] : bad) {
    FusionOptions b{method, 0.2, 0};
    b.method_options = opts;
    const std::string name = opts.begin().key();
    try {
      ex.prefill(req, b);
      ADD_FAILURE() << method << " accepted " << opts.dump();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << method << " " << opts.dump() << ": " << e.what();
    }
  }
  // Named layer views.
  const int L = m.hparams().n_layers;
  for (const auto& [view, expect] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"middle", {L / 2}}, {"last", {L - 1}}, {"top1", {qcfuse::bundled_profile(m.fingerprint_hex())->critical_layers[0]}}}) {
    o.method_options = {{"layers", view}};
    EXPECT_EQ(ex.prefill(req, o).selection_details.at("critical_layers"), expect) << view;
  }
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

// Critical-layer candidates: every layer on a model without sliding-window layers, only the
// global ones on a model with them (auto), and every layer again if none were global.
TEST(QcfuseProfile, LayerCandidatesKeepLocalLayersOutOnlyWhereThereAreAny) {
  ModelHparams plain;
  plain.n_layers = 4;
  const std::vector<int> all{0, 1, 2, 3};
  for (auto c : {qcfuse::LayerCandidates::automatic, qcfuse::LayerCandidates::all, qcfuse::LayerCandidates::global})
    EXPECT_EQ(qcfuse::candidate_layers(c, plain), all);
  ModelHparams swa = plain;  // local layers 0 and 2, global 1 and 3
  swa.sliding_window = 512;
  swa.layer_is_local = {1, 0, 1, 0};
  EXPECT_EQ(qcfuse::candidate_layers(qcfuse::LayerCandidates::automatic, swa), (std::vector<int>{1, 3}));
  EXPECT_EQ(qcfuse::candidate_layers(qcfuse::LayerCandidates::global, swa), (std::vector<int>{1, 3}));
  EXPECT_EQ(qcfuse::candidate_layers(qcfuse::LayerCandidates::all, swa), all);
  swa.layer_is_local = {1, 1, 1, 1};
  EXPECT_EQ(qcfuse::candidate_layers(qcfuse::LayerCandidates::global, swa), all);
  EXPECT_EQ(qcfuse::fallback_critical_layer(plain), 2);  // floor(L/2)
  EXPECT_EQ(qcfuse::fallback_critical_layer(swa), 2);    // every layer local: floor(L/2) still
  swa.layer_is_local = {1, 0, 1, 0};
  EXPECT_EQ(qcfuse::fallback_critical_layer(swa), 1);  // 2 is local; 1 and 3 are as near: the lower
  swa.n_layers = 6;
  swa.layer_is_local = {1, 1, 1, 1, 1, 0};  // Gemma 3's pattern: one global layer in six
  EXPECT_EQ(qcfuse::fallback_critical_layer(swa), 5);
  EXPECT_EQ(qcfuse::parse_layer_candidates("auto"), qcfuse::LayerCandidates::automatic);
  EXPECT_EQ(qcfuse::parse_layer_candidates("global"), qcfuse::LayerCandidates::global);
  EXPECT_THROW(qcfuse::parse_layer_candidates("local"), std::runtime_error);
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

TEST_F(Qcfuse, ProfileFromCalibrationDataRoundTripsSlow) {
  const std::string dir = test::shared_datasets_dir();
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
  EXPECT_EQ(q->target, "evidence");

  // Against ProphetKV's own top-10% set (no labels): the anchor view at all layers finds
  // most of it, and the target is recorded.
  opt.target = qcfuse::ProfileTarget::prophet;
  const qcfuse::LayerProfile pp = qcfuse::profile_critical_layers(fwd, store, examples, opt);
  EXPECT_EQ(pp.target, "prophet");
  ASSERT_EQ(pp.critical_layers.size(), 3u);
  for (double r : pp.recall) EXPECT_TRUE(r >= 0.0 && r <= 1.0);
  EXPECT_GT(pp.all_layers_recall, 0.5);
  EXPECT_GE(pp.all_layers_recall, *std::min_element(pp.recall.begin(), pp.recall.end()));
  EXPECT_EQ(qcfuse::profile_from_json(qcfuse::profile_to_json(pp)).target, "prophet");
}

}  // namespace
}  // namespace cf

// Invariants of the fused prefill (docs/ARCHITECTURE.md), on the real model: rho = 1 reproduces full
// prefill and rho = 0 reproduces full reuse, for every selector.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "../runtime/model_fixture.h"
#include "fusion_invariants.h"
#include "fusion/methods.h"
#include "fusion/executor.h"
#include "runtime/sampler.h"

namespace cf {
namespace {

using test::max_diff;

std::vector<Passage> passages() {
  return {
      {"Marie Curie", "Marie Curie was a physicist and chemist who pioneered research on radioactivity. She won "
                      "Nobel Prizes in physics (1903) and chemistry (1911)."},
      {"Warsaw", "Warsaw is the capital and largest city of Poland. Marie Curie was born there in 1867."},
      {"Sorbonne", "The Sorbonne in Paris is where Curie studied and later became the first woman professor."},
  };
}

class Fusion : public ::testing::Test {
 protected:
  void SetUp() override { CF_REQUIRE_MODEL(); }
};

TEST_F(Fusion, RatioOneReproducesFullPrefillForEverySelector) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  test::expect_ratio_one_is_full_prefill(ex, build_rag_request(m, passages(), "Where was Marie Curie born?"));
}

TEST_F(Fusion, RatioZeroIsFullReuseForEverySelector) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  test::expect_ratio_zero_is_reuse(ex, build_rag_request(m, passages(), "Where was Marie Curie born?"));
}

TEST_F(Fusion, SelectorsRespectTheBudgetAndStayInTheContext) {
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
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
  test::FusionRig rig(test::shared_model());
  auto& [m, fwd, store, ex] = rig;
  const RagRequest req = build_rag_request(m, passages(), "Q?");
  EXPECT_THROW(ex.prefill(req, {"nonsense", 0.1, 0}), std::invalid_argument);
  EXPECT_THROW(ex.prefill(req, {"epic", 1.5, 0}), std::invalid_argument);
  EXPECT_THROW(ex.prefill(req, {"epic", -0.1, 0}), std::invalid_argument);
}

// The registry (issue 61) is the one place a method's name means something: its kind, whether it
// takes the request's ratio, and the one check of a request's fusion settings.
TEST(MethodRegistry, KindsTraitsAndTheOneCheck) {
  EXPECT_EQ(method_entry("full").kind, MethodKind::full);
  EXPECT_EQ(method_entry("auto").kind, MethodKind::automatic);
  EXPECT_EQ(find_method("nope"), nullptr);
  EXPECT_THROW(method_entry("nope"), std::invalid_argument);
  EXPECT_THROW(make_selector("full"), std::invalid_argument);  // not a selector
  EXPECT_DOUBLE_EQ(method_entry("full").fixed_ratio, 1.0);
  EXPECT_DOUBLE_EQ(method_entry("reuse").fixed_ratio, 0.0);
  EXPECT_TRUE(method_entry("epic").takes_ratio());
  EXPECT_TRUE(enriches_from_corpus("fusionrag"));
  EXPECT_FALSE(enriches_from_corpus("qcfuse"));
  size_t selectors = 0;
  for (const MethodEntry& e : method_entries()) {
    EXPECT_EQ(e.kind == MethodKind::selector, e.make != nullptr) << e.name;
    if (e.make) {
      EXPECT_EQ(e.make()->name(), e.name);
      ++selectors;
    }
    EXPECT_TRUE(nlohmann::json::parse(e.bench_options).is_object()) << e.name;
  }
  EXPECT_EQ(selectors, selector_names().size());
  EXPECT_TRUE(FusionOptions{}.full());
  EXPECT_TRUE(FusionOptions{.method = "auto"}.automatic());

  auto param_of = [](const FusionOptions& o, OptionsSource src) {
    try {
      validate_fusion_options(o, src);
    } catch (const FusionOptionsError& e) {
      return e.param;
    }
    return std::string("(accepted)");
  };
  const auto api = OptionsSource::api;
  EXPECT_EQ(param_of({.method = "epic", .ratio = 0.3}, api), "(accepted)");
  EXPECT_EQ(param_of({.method = "nope"}, api), "fusion.method");
  EXPECT_EQ(param_of({.method = "epic", .ratio = 1.5}, api), "fusion.ratio");
  EXPECT_EQ(param_of({.method = "full", .method_options = {{"x", 1}}}, api), "fusion.options");
  EXPECT_EQ(param_of({.method = "auto"}, api), "fusion.quality");
  EXPECT_EQ(param_of({.method = "auto", .quality = 0.9}, api), "(accepted)");
  EXPECT_EQ(param_of({.method = "epic", .quality = 0.9}, api), "fusion.quality");
  EXPECT_EQ(param_of({.method = "qcfuse", .method_options = {{"anchor_ratio", 3}}}, api), "fusion.options");
  // A client names only the listed values (no file is read for it); the CLI may give a file.
  EXPECT_EQ(param_of({.method = "qcfuse", .method_options = {{"profile", "evidence"}}}, api), "(accepted)");
  EXPECT_EQ(param_of({.method = "qcfuse", .method_options = {{"profile", "/etc/passwd"}}}, api), "fusion.options");
  EXPECT_EQ(param_of({.method = "qcfuse", .method_options = {{"profile", "/tmp/my.profile.json"}}},
                     OptionsSource::trusted),
            "(accepted)");  // trusted (ask, bench): a profile file, read when the selector runs
}

// GET /v1/methods lists what the selectors say they accept: every method, every parameter's
// default and every listed value must configure (so the page never offers what a request refuses).
TEST(MethodCatalog, EveryMethodAndEveryListedParameterConfigures) {
  const nlohmann::json catalog = method_catalog();
  std::vector<std::string> ids;
  for (const auto& m : catalog) ids.push_back(m.at("id"));
  std::vector<std::string> expected{"full"};
  for (const auto& n : selector_names()) expected.push_back(n);
  expected.push_back("auto");  // issue 26: takes fusion.quality (its "fields"), no options
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(catalog.back().at("fields").at(0).at("name"), "quality");
  size_t params = 0;
  for (const auto& m : catalog) {
    const std::string id = m.at("id");
    for (const auto& p : m.at("parameters")) {
      ++params;
      const std::string name = p.at("name");
      if (!p.at("default").is_null()) {
        EXPECT_NO_THROW(make_selector(id)->configure({{name, p.at("default")}})) << id << "." << name;
      }
      for (const auto& v : p.value("values", nlohmann::json::array())) {
        EXPECT_NO_THROW(make_selector(id)->configure({{name, v}})) << id << "." << name << " = " << v;
      }
      EXPECT_THROW(make_selector(id)->configure({{name + "_not", p.at("default")}}), std::invalid_argument) << id;
    }
  }
  EXPECT_GE(params, 10u);
}

// The executor owns its chunk keys (issue 25 item 2): what FusionExecutor::prefetch loads is
// what prefill then looks up, for both chunk contexts, so every chunk is a prefetch hit.
TEST_F(Fusion, PrefetchThenPrefillHitsEveryChunk) {
  namespace fs = std::filesystem;
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  const fs::path dir = fs::temp_directory_path() / ("cf_prefetch_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ChunkStoreOptions o;
  o.model = StoreModel{m.fingerprint(), m.hparams()};
  o.dir = dir.string();
  o.durable = false;
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  EXPECT_TRUE(FusionExecutor::chunk_keys(m.fingerprint(), req, {"full", 0.15, 0}).empty());  // looks none up
  for (ChunkContext variant : {ChunkContext::alone, ChunkContext::prefixed}) {
    FusionOptions fo{"epic", 0.15, 0};
    fo.chunk_context = variant;
    {
      ChunkStore writer(o);  // the caches on disk
      const FusionResult first = FusionExecutor(fwd, writer).prefill(req, fo);
      // Per chunk, whether its cache came from the store: none did, each was computed now.
      EXPECT_EQ(first.chunk_hit, std::vector<bool>(req.chunks.size(), false)) << chunk_context_name(variant);
    }
    ChunkStore store(o);  // a fresh memory tier over the same files
    FusionExecutor::prefetch(store, m.fingerprint(), req, fo);
    store.wait_prefetches();
    const FusionResult r = FusionExecutor(fwd, store).prefill(req, fo);
    const ChunkStoreStats s = store.stats();
    EXPECT_EQ(s.prefetches, req.chunks.size()) << chunk_context_name(variant);
    EXPECT_EQ(s.prefetch_hits, req.chunks.size()) << chunk_context_name(variant);
    EXPECT_EQ(r.chunk_hits, req.chunks.size()) << chunk_context_name(variant);
    EXPECT_EQ(r.chunk_hit, std::vector<bool>(req.chunks.size(), true)) << chunk_context_name(variant);
    EXPECT_EQ(s.computes, 0u) << chunk_context_name(variant);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cf

// The layer-wise deviation tool (issue 14, item 3) on the real model, one small example:
// rho = 1 is full prefill at every layer; layer 0's V of every row depends on its token only,
// so every method has exactly zero V deviation there (and K only the rounding of moving keys);
// reuse of alone caches deviates from layer 1 on; prefixed reuse serves the first chunk exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "../runtime/model_fixture.h"
#include "eval/deviation.h"
#include "fusion/executor.h"
#include "kv/chunk_store.h"

namespace cf::eval {
namespace {

namespace fs = std::filesystem;

Dataset tiny_dataset() {
  Dataset d;
  d.name = "tiny";
  QaExample e;
  e.id = "curie";
  e.question = "Where was Marie Curie born?";
  e.answers = {"Warsaw"};
  e.passages = {
      {"Marie Curie", "Marie Curie was a physicist and chemist who pioneered research on radioactivity."},
      {"Warsaw", "Warsaw is the capital of Poland. Marie Curie was born in Warsaw in 1867."},
      {"Nobel Prize", "The Nobel Prize in chemistry was awarded to Marie Curie in 1911 for radium."},
  };
  d.examples = {e};
  return d;
}

struct Row {
  double k = 0, v = 0;
};

TEST(Deviation, KvDeviationRejectsBadRanges) {
  ModelHparams h;
  h.n_layers = 2;
  h.n_kv_heads = 1;
  h.head_dim = 4;
  h.n_heads = 1;
  h.rope_dims = 4;
  KvCache a(h), b(h);
  a.append(3);
  b.append(2);
  EXPECT_THROW(kv_deviation(a, b, 0, 3), std::invalid_argument);
  EXPECT_THROW(kv_deviation(a, a, 2, 1), std::invalid_argument);
  const auto same = kv_deviation(a, a, 0, 3);  // all zero: distance 0, not NaN
  ASSERT_EQ(same.size(), 2u);
  EXPECT_EQ(same[1].k_rel, 0.0);
}

TEST(Deviation, RatioOneIsZeroLayerZeroValuesAreExactAndReuseDeviatesLaterSlow) {
  CF_REQUIRE_MODEL();
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  const fs::path out = fs::temp_directory_path() / ("cf_deviation_" + std::to_string(::getpid()));
  fs::remove_all(out);
  DeviationConfig cfg;
  cfg.methods = {"reuse", "epic", "fusionrag"};
  cfg.ratios = {0, 1};
  cfg.limit = 1;
  cfg.out_dir = out.string();
  cfg.progress = false;
  const std::string path = run_deviation(fwd, tiny_dataset(), cfg);

  // (chunk context, method, ratio, part, layer) -> distances
  std::map<std::tuple<std::string, std::string, std::string, std::string, int>, Row> rows;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "dataset,example,chunk_context,method,ratio,part,layer,k_rel,v_rel");
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::vector<std::string> f;
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    ASSERT_EQ(f.size(), 9u) << line;
    rows[{f[2], f[3], f[4], f[5], std::stoi(f[6])}] = {std::stod(f[7]), std::stod(f[8])};
  }
  const int layers = m.hparams().n_layers;
  // 2 chunk contexts x (reuse + 2 methods x 2 ratios) x 2 parts x layers
  EXPECT_EQ(rows.size(), static_cast<size_t>(2 * 5 * 2 * layers));
  for (const std::string context : {"alone", "prefixed"}) {
    for (const std::string part : {"context", "question"})
      for (int l = 0; l < layers; ++l) {
        for (const std::string method : {"epic", "fusionrag"}) {
          const Row r = rows.at({context, method, "1", part, l});
          EXPECT_LT(r.k, 1e-3) << context << " " << method << " " << part << " layer " << l;
          EXPECT_LT(r.v, 1e-3) << context << " " << method << " " << part << " layer " << l;
        }
      }
    for (const std::string method : {"reuse", "fusionrag"}) {
      const Row ctx0 = rows.at({context, method, "0", "context", 0});
      EXPECT_EQ(ctx0.v, 0.0) << context << " " << method << ": layer-0 V depends on the token only";
      EXPECT_LT(ctx0.k, 1e-3) << context << " " << method << ": layer-0 K differs by moving keys only";
      EXPECT_EQ(rows.at({context, method, "0", "question", 0}).v, 0.0);
    }
    // Reuse lacks the cross-chunk context from layer 1 on, on the chunks and so on U.
    for (int l = 1; l < layers; ++l) EXPECT_GT(rows.at({context, "reuse", "0", "context", l}).v, 1e-3) << l;
    EXPECT_GT(rows.at({context, "reuse", "0", "question", layers - 1}).k, 1e-3);
  }
  // Prefixed caches saw S: less deviation than alone ones on the chunks from layer 1 on (the
  // first chunk is even exact), on average over the layers.
  double alone = 0, prefixed = 0;
  for (int l = 1; l < layers; ++l) {
    alone += rows.at({"alone", "reuse", "0", "context", l}).k;
    prefixed += rows.at({"prefixed", "reuse", "0", "context", l}).k;
  }
  EXPECT_LT(prefixed, alone);
  fs::remove_all(out);
}

}  // namespace
}  // namespace cf::eval

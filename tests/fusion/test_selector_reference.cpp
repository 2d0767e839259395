// Reference tests of every selector's choice (issue 24), in the manner of test_fusionrag.cpp:
// the score a selector ranks by is recomputed here, separately, with plain loops over the K/V
// the test reads back (or worked out by hand), and the selector's slots must be the top of it.
//  - top_k_slots: ties, stability, k = 0, k = n;
//  - EPIC: the water-filling allocation worked out by hand;
//  - Random: same seed same set, other seeds other sets, positions spread uniformly (chi-square);
//  - CacheBlend: squared deviation of fresh (full-prefill) keys from reused ones at layer 1;
//  - Oracle: K/V deviation from full prefill over every layer, each relative to its K/V norm;
//  - ProphetKV: the question rows' attention over S + context + U, every layer and head, as a
//    plain softmax of q.k / sqrt(d) from the probe's queries and the cache's keys;
//  - QCFuse: KVzip anchor scores (repeat prompt's max attention) and the anchor-view probe's
//    critical-layer scores, both recomputed the same plain way, and the selector's slots.
// Where scores come from float kernels, "the top of it" allows a near-tie at the cut: a chosen
// slot's reference score must reach the k-th largest minus a small tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "../runtime/model_fixture.h"
#include "fusion/executor.h"
#include "fusion/qcfuse.h"
#include "fusion/methods.h"
#include "fusion/top_k.h"
#include "runtime/vector_math.h"

namespace cf {
namespace {

// ------------------------------------------------------------------------ top_k_slots

TEST(SelectorReference, TopKSlotsTiesStabilityAndEdges) {
  const std::vector<double> s = {0.5, 2.0, 2.0, -1.0, 7.0, 2.0};
  // Top 3: 7 (4), then the tie at 2.0 broken by the lower slot (1, 2), ascending, offset 10.
  EXPECT_EQ(top_k_slots(s, 10, 3), (std::vector<size_t>{11, 12, 14}));
  EXPECT_EQ(top_k_slots(s, 0, 4), (std::vector<size_t>{1, 2, 4, 5}));
  EXPECT_EQ(top_k_slots(s, 0, 1), (std::vector<size_t>{4}));
  EXPECT_TRUE(top_k_slots(s, 0, 0).empty());
  EXPECT_EQ(top_k_slots(s, 3, 6), (std::vector<size_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(top_k_slots(s, 3, 60), (std::vector<size_t>{3, 4, 5, 6, 7, 8})) << "k > n is n";
  EXPECT_TRUE(top_k_slots({}, 0, 3).empty());
  const std::vector<double> flat(8, 1.0);  // all tied: the first k
  EXPECT_EQ(top_k_slots(flat, 0, 3), (std::vector<size_t>{0, 1, 2}));
  // Against a plain reference on random scores with many ties.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> r(1 + rng() % 30);
    for (double& x : r) x = static_cast<double>(rng() % 5);
    const size_t k = rng() % (r.size() + 1);
    std::vector<size_t> want;
    for (size_t i = 0; i < r.size(); ++i) {
      size_t better = 0;  // slots ranked above i: higher score, or equal and lower slot
      for (size_t j = 0; j < r.size(); ++j) better += r[j] > r[i] || (r[j] == r[i] && j < i);
      if (better < k) want.push_back(i + 2);
    }
    EXPECT_EQ(top_k_slots(r, 2, k), want);
  }
}

// --------------------------------------------------------------------- selector inputs

// A selector's inputs over `cache` with chunks of the given sizes after `s_len` slots of S.
struct Inputs {
  RagRequest req;
  KvCache cache;
  std::vector<TokenId> tokens;
  Inputs(const ModelHparams& h, size_t s_len, const std::vector<size_t>& sizes) : cache(h) {
    req.system.assign(s_len, 1);
    for (size_t n : sizes) req.chunks.emplace_back(n, 2);
    tokens = req.flatten();
  }
  FusionInputs make(double ratio, uint64_t seed) {
    FusionInputs in{req, cache, {}, req.system.size(), req.system.size() + req.context_tokens(), tokens, ratio, seed};
    size_t b = in.context_begin;
    for (const auto& c : req.chunks) {
      in.chunks.push_back({b, c.size(), nullptr});
      b += c.size();
    }
    return in;
  }
};

class SelectorRef : public ::testing::Test {
 protected:
  void SetUp() override { CF_REQUIRE_MODEL(); }
};

// ------------------------------------------------------------------------------- EPIC

TEST_F(SelectorRef, EpicAllocationWorkedOutByHand) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  auto epic = make_selector("epic");
  {
    // Chunks 3, 10, 6 after 5 slots of S; ratio 0.8: budget floor(0.8 * 19) = 15. Round 1:
    // share 15 / 3 = 5: chunk 0 takes its 3, chunks 1 and 2 take 5 (left 2). Round 2: two
    // chunks open, share 1 each: 3, 6, 6.
    Inputs x(m.hparams(), 5, {3, 10, 6});
    FusionInputs in = x.make(0.8, 0);
    const Selection s = epic->select(fwd, in);
    std::vector<size_t> want = {5, 6, 7};                                  // chunk 0: slots 5..7
    for (size_t t = 0; t < 6; ++t) want.push_back(8 + t);                  // chunk 1 starts at 8
    for (size_t t = 0; t < 6; ++t) want.push_back(18 + t);                 // chunk 2 starts at 18
    EXPECT_EQ(s.slots, want);
    EXPECT_EQ(s.details["per_chunk"], (std::vector<size_t>{3, 6, 6}));
    ASSERT_EQ(s.scores.size(), 19u);
    EXPECT_DOUBLE_EQ(s.scores[3], 1.0) << "each chunk's first token scores 1";
    EXPECT_DOUBLE_EQ(s.scores[4], 0.5);
  }
  {
    // Three chunks of 10, ratio 0.55: budget 16; share 5 each (left 1); then share
    // max(1, 1 / 3) = 1 goes to the first open chunk: 6, 5, 5.
    Inputs x(m.hparams(), 2, {10, 10, 10});
    FusionInputs in = x.make(0.55, 0);
    const Selection s = epic->select(fwd, in);
    EXPECT_EQ(s.details["per_chunk"], (std::vector<size_t>{6, 5, 5}));
    std::vector<size_t> want;
    for (size_t t = 0; t < 6; ++t) want.push_back(2 + t);
    for (size_t t = 0; t < 5; ++t) want.push_back(12 + t);
    for (size_t t = 0; t < 5; ++t) want.push_back(22 + t);
    EXPECT_EQ(s.slots, want);
  }
  {
    Inputs x(m.hparams(), 2, {4, 4});
    FusionInputs zero = x.make(0.0, 0), all = x.make(1.0, 0);
    EXPECT_TRUE(epic->select(fwd, zero).slots.empty());
    EXPECT_EQ(epic->select(fwd, all).slots.size(), 8u);
  }
}

// ----------------------------------------------------------------------------- Random

TEST_F(SelectorRef, RandomIsSeededAndUniform) {
  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  auto random = make_selector("random");
  Inputs big(m.hparams(), 3, {120, 80});
  auto draw = [&](Inputs& x, double ratio, uint64_t seed) {
    FusionInputs in = x.make(ratio, seed);
    return random->select(fwd, in).slots;
  };
  const auto a = draw(big, 0.25, 11);
  EXPECT_EQ(a.size(), 50u);
  EXPECT_EQ(draw(big, 0.25, 11), a) << "same seed, same set";
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::set<size_t>(a.begin(), a.end()).size(), a.size());
  std::set<std::vector<size_t>> sets;
  for (uint64_t seed = 0; seed < 20; ++seed) sets.insert(draw(big, 0.25, seed));
  EXPECT_EQ(sets.size(), 20u) << "different seeds, different sets (C(200,50) sets to draw from)";

  // Uniform: 20 context slots, 5 drawn per seed, 2000 seeds: each slot expected 500 times.
  // Chi-square over 20 cells (19 df): P(X > 64.4) < 1e-6 for a uniform multinomial (the
  // Wilson-Hilferty bound at z = 4.75); draws without replacement only lower the variance.
  Inputs small(m.hparams(), 4, {12, 8});
  std::vector<double> count(20, 0);
  const int seeds = 2000;
  for (int seed = 0; seed < seeds; ++seed)
    for (size_t s : draw(small, 0.25, static_cast<uint64_t>(seed))) {
      ASSERT_GE(s, 4u);
      ASSERT_LT(s, 24u);
      ++count[s - 4];
    }
  const double expected = seeds * 5.0 / 20;
  double chi2 = 0;
  for (double c : count) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 64.4) << "positions are not spread uniformly";
}

// ---------------------------------------------------------------- model-based references

std::vector<Passage> passages() {
  return {
      {"Marie Curie", "Marie Curie was a physicist and chemist who pioneered research on radioactivity. She won "
                      "Nobel Prizes in physics (1903) and chemistry (1911)."},
      {"Warsaw", "Warsaw is the capital and largest city of Poland. Marie Curie was born there in 1867."},
      {"Sorbonne", "The Sorbonne in Paris is where Curie studied and later became the first woman professor."},
  };
}

// S prefilled at 0.., then each chunk's cache computed ALONE at 0.. and moved to its request
// positions: what the executor stitches for an "alone" request.
KvCache stitch(Forward& fwd, const RagRequest& req) {
  const ModelHparams& h = fwd.model().hparams();
  KvCache kv(h, req.flatten().size());
  fwd.run(kv, {req.system, test::iota_positions(req.system.size()), {}, {}});
  for (const auto& c : req.chunks) {
    KvCache alone(h);
    fwd.run(alone, {c, test::iota_positions(c.size()), {}, {}});
    kv.append_from(alone, 0, alone.size(), static_cast<int32_t>(kv.size()));
  }
  return kv;
}

std::vector<float> read_k(const KvCache& kv, int layer, size_t from, size_t n) {
  std::vector<float> k(n * static_cast<size_t>(kv.kv_dim()));
  kv.read_k(layer, from, n, k.data());
  return k;
}

// Plain attention of one query row over `n_keys` keys ([key][kv_dim]): per head the softmax
// of q.k / sqrt(head_dim); out[head][key].
std::vector<std::vector<double>> naive_attention(const ModelHparams& h, const float* q, const float* keys, size_t n_keys) {
  std::vector<std::vector<double>> out(static_cast<size_t>(h.n_heads), std::vector<double>(n_keys));
  const int group = h.n_heads / h.n_kv_heads;
  for (int hh = 0; hh < h.n_heads; ++hh) {
    auto& w = out[static_cast<size_t>(hh)];
    double top = -1e300, z = 0;
    for (size_t j = 0; j < n_keys; ++j) {
      double dot = 0;
      for (int d = 0; d < h.head_dim; ++d)
        dot += double(q[hh * h.head_dim + d]) * keys[j * h.kv_dim() + (hh / group) * h.head_dim + d];
      w[j] = dot / std::sqrt(double(h.head_dim));
      top = std::max(top, w[j]);
    }
    for (double& x : w) z += (x = std::exp(x - top));
    for (double& x : w) x /= z;
  }
  return out;
}

// f16 rounding, as the cache stores keys.
std::vector<float> f16_round(const float* x, size_t n) {
  std::vector<uint16_t> bits(n);
  f32_to_f16(x, bits.data(), n);
  std::vector<float> out(n);
  f16_to_f32(bits.data(), out.data(), n);
  return out;
}

// The selector's slots must be the top k of `ref`, allowing a near-tie at the cut.
void expect_top_of(const std::vector<size_t>& slots, const std::vector<double>& ref, size_t first_slot, size_t k,
                   double tol, const std::string& what) {
  ASSERT_EQ(slots.size(), k) << what;
  std::vector<double> sorted = ref;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const double kth = sorted[k - 1];
  for (size_t s : slots) {
    ASSERT_GE(s, first_slot);
    ASSERT_LT(s - first_slot, ref.size());
    EXPECT_GE(ref[s - first_slot], kth - tol) << what << ": slot " << s << " is not among the top " << k;
  }
  // And the selector's top set is the reference's exactly where no tie is near the cut.
  const auto exact = top_k_slots(ref, first_slot, k);
  size_t agree = 0;
  for (size_t s : exact) agree += std::binary_search(slots.begin(), slots.end(), s);
  EXPECT_GE(agree + 1, k) << what << ": at most one near-tie may differ";
}

void expect_scores_near(const std::vector<double>& got, const std::vector<double>& ref, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double scale = *std::max_element(ref.begin(), ref.end());
  ASSERT_GT(scale, 0) << what;
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], rel * scale) << what << ": context token " << i;
}

// ------------------------------------------------------------------------- CacheBlend

TEST_F(SelectorRef, CacheBlendRanksByKeyDeviationAtLayerOne) {
  const Model& m = test::shared_model();
  const ModelHparams& h = m.hparams();
  Forward fwd(m, test::shared_pool());
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  const size_t cb = req.system.size(), n = req.context_tokens(), ce = cb + n;
  KvCache stitched = stitch(fwd, req);
  const auto reused = read_k(stitched, 1, cb, n);
  // Fresh keys: S and the context prefilled in one pass, as full prefill computes them.
  KvCache full(h);
  const std::vector<TokenId> all = req.flatten();
  fwd.run(full, {std::span<const TokenId>(all).first(ce), test::iota_positions(ce), {}, {}});
  const auto fresh = read_k(full, 1, cb, n);
  std::vector<double> ref(n, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (int j = 0; j < h.kv_dim(); ++j) {
      const double d = double(fresh[i * h.kv_dim() + j]) - reused[i * h.kv_dim() + j];
      ref[i] += d * d;
    }
  auto sel = make_selector("cacheblend");
  const std::vector<TokenId> tokens = all;
  FusionInputs in{req, stitched, {}, cb, ce, tokens, 0.2, 0};
  const Selection s = sel->select(fwd, in);
  expect_scores_near(s.scores, ref, 1e-3, "cacheblend deviation");
  const size_t k = recompute_budget(0.2, n);
  expect_top_of(s.slots, ref, cb, k, 1e-3 * ref[top_k_slots(ref, 0, 1)[0]], "cacheblend");
  EXPECT_GT(*std::max_element(ref.begin(), ref.end()), 0.0);
}

// ----------------------------------------------------------------------------- Oracle

// The postmortem oracle: every layer's squared K and V deviation of the reused cache from full
// prefill, each layer divided by its mean squared full-prefill K/V norm over the context, summed.
TEST_F(SelectorRef, OracleRanksByRelativeKvDeviationOverEveryLayer) {
  const Model& m = test::shared_model();
  const ModelHparams& h = m.hparams();
  Forward fwd(m, test::shared_pool());
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  const size_t cb = req.system.size(), n = req.context_tokens(), ce = cb + n, kvd = static_cast<size_t>(h.kv_dim());
  KvCache stitched = stitch(fwd, req);
  const KvCache before = stitched;  // the selector must leave the cache as it found it
  KvCache full(h);
  const std::vector<TokenId> all = req.flatten();
  fwd.run(full, {std::span<const TokenId>(all).first(ce), test::iota_positions(ce), {}, {}});
  std::vector<double> ref(n, 0.0), per_layer_top;
  std::vector<float> a(n * kvd), b(n * kvd);
  for (int l = 0; l < h.n_layers; ++l) {
    std::vector<double> dev(n, 0.0);
    double norm2 = 0;
    for (int kv = 0; kv < 2; ++kv) {
      if (kv == 0) {
        full.read_k(l, cb, n, a.data());
        stitched.read_k(l, cb, n, b.data());
      } else {
        full.read_v(l, cb, n, a.data());
        stitched.read_v(l, cb, n, b.data());
      }
      for (size_t i = 0; i < n * kvd; ++i) {
        dev[i / kvd] += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        norm2 += double(a[i]) * a[i];
      }
    }
    for (size_t i = 0; i < n; ++i) ref[i] += dev[i] / (norm2 / double(n));
  }
  auto sel = make_selector("oracle");
  FusionInputs in{req, stitched, {}, cb, ce, all, 0.15, 0};
  const Selection s = sel->select(fwd, in);
  expect_scores_near(s.scores, ref, 1e-6, "oracle deviation");
  const size_t k = recompute_budget(0.15, n);
  expect_top_of(s.slots, ref, cb, k, 1e-6 * ref[top_k_slots(ref, 0, 1)[0]], "oracle");
  // Alone chunks deviate: the chosen tokens carry more deviation than a random set of k.
  double chosen = 0, total = 0;
  for (size_t slot : s.slots) chosen += ref[slot - cb];
  for (double x : ref) total += x;
  EXPECT_GT(chosen / total, 1.5 * double(k) / double(n)) << "the top 15% hold well above 15% of the deviation";
  for (int l = 0; l < h.n_layers; ++l)
    EXPECT_EQ(read_k(stitched, l, 0, ce), read_k(before, l, 0, ce)) << "layer " << l << " changed";
  FusionInputs none{req, stitched, {}, cb, ce, all, 0.0, 0};
  EXPECT_TRUE(sel->select(fwd, none).slots.empty());
}

// ---------------------------------------------------------------------------- Prophet

// Question-row attention over S + context + U (causal), summed over heads and rows, per layer
// in `layers`, with U run over `run_cache` (the stitched cache or an anchor view) at positions
// ce..; keys of S + context from `stitched`. Plain loops.
std::vector<std::vector<double>> naive_probe(Forward& fwd, const KvCache& stitched, KvCache run_cache, size_t cb, size_t ce,
                                             std::span<const TokenId> suffix, size_t rb, size_t re,
                                             const std::vector<int>& layers) {
  const ModelHparams& h = fwd.model().hparams();
  const size_t kvd = static_cast<size_t>(h.kv_dim());
  std::vector<std::vector<double>> out(layers.size(), std::vector<double>(ce - cb, 0.0));
  ForwardHooks hooks;
  hooks.rows.resize(re);
  std::iota(hooks.rows.begin(), hooks.rows.end(), size_t{0});
  hooks.on_layer = [&](const LayerTap& t) {
    const auto it = std::find(layers.begin(), layers.end(), t.layer);
    if (it == layers.end()) return;
    std::vector<float> keys = read_k(stitched, t.layer, 0, ce);
    const auto uk = f16_round(t.k, re * kvd);
    keys.insert(keys.end(), uk.begin(), uk.end());
    auto& acc = out[static_cast<size_t>(it - layers.begin())];
    for (size_t r = rb; r < re; ++r) {
      const auto p = naive_attention(h, t.q + r * h.q_dim(), keys.data(), ce + r + 1);
      for (int hh = 0; hh < h.n_heads; ++hh)
        for (size_t c = cb; c < ce; ++c) acc[c - cb] += p[static_cast<size_t>(hh)][c];
    }
  };
  fwd.run(run_cache, {suffix.first(re), test::iota_positions(re, static_cast<int32_t>(ce)), {}, {}}, &hooks);
  return out;
}

TEST_F(SelectorRef, ProphetRanksByQuestionAttentionOverAllLayers) {
  const Model& m = test::shared_model();
  const ModelHparams& h = m.hparams();
  Forward fwd(m, test::shared_pool());
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  const size_t cb = req.system.size(), n = req.context_tokens(), ce = cb + n;
  KvCache stitched = stitch(fwd, req);
  const auto [rb, re] = qcfuse::probe_row_range(req, qcfuse::ProbeRows::question);
  ASSERT_LT(rb, re);
  std::vector<int> all(static_cast<size_t>(h.n_layers));
  std::iota(all.begin(), all.end(), 0);
  const auto per_layer = naive_probe(fwd, stitched, stitched, cb, ce, req.suffix, rb, re, all);
  std::vector<double> ref(n, 0.0);
  for (const auto& l : per_layer)
    for (size_t i = 0; i < n; ++i) ref[i] += l[i];
  auto sel = make_selector("prophet");
  const std::vector<TokenId> tokens = req.flatten();
  FusionInputs in{req, stitched, {}, cb, ce, tokens, 0.2, 0};
  const Selection s = sel->select(fwd, in);
  EXPECT_EQ(stitched.size(), ce);
  expect_scores_near(s.scores, ref, 1e-3, "prophet attention");
  expect_top_of(s.slots, ref, cb, recompute_budget(0.2, n), 2e-3 * *std::max_element(ref.begin(), ref.end()), "prophet");
}

// ----------------------------------------------------------------------------- QCFuse

// KVzip score of each entry of a chunk cache (no sinks), per layer: the repeat prompt after
// the chunk, max over heads and prompt rows of the attention the entry gets. Plain loops.
std::vector<std::vector<double>> naive_kvzip(Forward& fwd, const KvCache& chunk) {
  const Model& m = fwd.model();
  const ModelHparams& h = m.hparams();
  const size_t n = chunk.size(), kvd = static_cast<size_t>(h.kv_dim());
  const std::vector<TokenId> prompt = m.tokenizer().encode(qcfuse::kRepeatPrompt, false, false);
  std::vector<std::vector<double>> out(static_cast<size_t>(h.n_layers), std::vector<double>(n, 0.0));
  KvCache scratch = chunk;
  ForwardHooks hooks;
  hooks.rows.resize(prompt.size());
  std::iota(hooks.rows.begin(), hooks.rows.end(), size_t{0});
  hooks.on_layer = [&](const LayerTap& t) {
    std::vector<float> keys = read_k(chunk, t.layer, 0, n);
    const auto pk = f16_round(t.k, prompt.size() * kvd);
    keys.insert(keys.end(), pk.begin(), pk.end());
    for (size_t r = 0; r < prompt.size(); ++r) {
      const auto p = naive_attention(h, t.q + r * h.q_dim(), keys.data(), n + r + 1);
      for (const auto& head : p)
        for (size_t e = 0; e < n; ++e) out[static_cast<size_t>(t.layer)][e] = std::max(out[static_cast<size_t>(t.layer)][e], head[e]);
    }
  };
  fwd.run(scratch, {prompt, test::iota_positions(prompt.size(), static_cast<int32_t>(chunk.position(n - 1) + 1)), {}, {}},
          &hooks);
  return out;
}

TEST_F(SelectorRef, QcfuseAnchorsAndCriticalLayerScoresMatchAPlainRecomputationSlow) {
  const Model& m = test::shared_model();
  const ModelHparams& h = m.hparams();
  Forward fwd(m, test::shared_pool());
  const RagRequest req = build_rag_request(m, passages(), "Where was Marie Curie born?");
  const size_t cb = req.system.size(), n = req.context_tokens(), ce = cb + n;
  const double ra = 0.3;

  // Anchors (Eq. 14, shared mode, no sinks): KVzip scores summed over layers; the first four
  // tokens forced; then by descending score, ties to the lower position; ceil(ra |c|), ascending.
  KvCache stitched = stitch(fwd, req);
  std::vector<size_t> anchors;  // stitched slots
  size_t begin = cb;
  for (const auto& c : req.chunks) {
    KvCache alone(h);
    fwd.run(alone, {c, test::iota_positions(c.size()), {}, {}});
    const auto by_layer = naive_kvzip(fwd, alone);
    const auto engine = qcfuse::kvzip_layer_scores(fwd, alone, nullptr);
    ASSERT_EQ(engine.size(), by_layer.size());
    for (size_t l = 0; l < by_layer.size(); ++l)
      expect_scores_near(engine[l], by_layer[l], 2e-3, "kvzip layer " + std::to_string(l));
    std::vector<double> sum(c.size(), 0.0);
    for (const auto& l : by_layer)
      for (size_t i = 0; i < c.size(); ++i) sum[i] += l[i];
    std::vector<size_t> order(c.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin() + 4, order.end(), [&](size_t a, size_t b) { return sum[a] > sum[b]; });
    const size_t keep = static_cast<size_t>(std::ceil(ra * static_cast<double>(c.size())));
    std::vector<size_t> mine(order.begin(), order.begin() + keep);
    std::sort(mine.begin(), mine.end());
    // The engine's ranking of the engine's scores: the same set where no near-tie is at the cut.
    std::vector<double> esum(c.size(), 0.0);
    for (const auto& l : engine)
      for (size_t i = 0; i < c.size(); ++i) esum[i] += l[i];
    const auto ranked = qcfuse::rank_anchors(esum, ra);
    size_t agree = 0;
    for (uint32_t a : ranked) agree += std::binary_search(mine.begin(), mine.end(), size_t{a});
    EXPECT_GE(agree + 1, keep) << "anchors of a chunk";
    for (size_t a : mine) anchors.push_back(begin + a);
    begin += c.size();
  }

  // Critical-layer scores (Eq. 15-18, 20): U over S + the anchors (positions kept), the
  // question rows' queries at layers 3, 7, 11 scored against the FULL stitched keys.
  const std::vector<int> layers = {3, 7, 11};
  KvCache view(h);
  view.append_from(stitched, 0, cb, 0);
  for (size_t a : anchors) view.append_from(stitched, a, a + 1, 0);
  const auto [rb, re] = qcfuse::probe_row_range(req, qcfuse::ProbeRows::question);
  const auto ref_layers = naive_probe(fwd, stitched, view, cb, ce, req.suffix, rb, re, layers);
  qcfuse::ProbeView pv;
  pv.anchors = {anchors};
  const auto engine = qcfuse::query_probe(fwd, stitched, cb, ce, pv, req.suffix, rb, re, layers);
  ASSERT_EQ(engine.scores.size(), layers.size());
  for (size_t l = 0; l < layers.size(); ++l)
    expect_scores_near(engine.scores[l], ref_layers[l], 1e-3, "probe layer " + std::to_string(layers[l]));
  std::vector<double> ref(n, 0.0);
  for (const auto& l : ref_layers)
    for (size_t i = 0; i < n; ++i) ref[i] += l[i];

  // The selector, shared anchors without sinks at these layers, picks the top of that sum.
  auto sel = make_selector("qcfuse");
  sel->configure({{"anchors", "shared"}, {"anchor_sinks", false}, {"anchor_ratio", ra}, {"layers", layers}});
  const std::vector<TokenId> tokens = req.flatten();
  FusionInputs in{req, stitched, {}, cb, ce, tokens, 0.2, 0};
  begin = cb;
  for (const auto& c : req.chunks) {
    auto cc = std::make_shared<ChunkCache>(compute_chunk_cache(fwd, ChunkKey(m.fingerprint(), c)));
    in.chunks.push_back({begin, c.size(), cc});
    begin += c.size();
  }
  const Selection s = sel->select(fwd, in);
  EXPECT_EQ(stitched.size(), ce);
  expect_scores_near(s.scores, ref, 2e-3, "qcfuse score");
  expect_top_of(s.slots, ref, cb, recompute_budget(0.2, n), 3e-3 * *std::max_element(ref.begin(), ref.end()), "qcfuse");
}

}  // namespace
}  // namespace cf

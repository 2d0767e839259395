// Gemma 3 specifics of the forward pass on the real file: the sliding window of the local
// layers, per-layer RoPE bases when keys move, and bad metadata rejected with one clear
// error. (Agreement with llama.cpp: test_golden.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "kv_rows.h"
#include "model_fixture.h"
#include "runtime/forward.h"

namespace cf {
namespace {

using test::shared_gemma3;
using test::shared_pool;

std::vector<TokenId> gemma_tokens(size_t n) {
  const std::string text =
      "The river delta supports rice farming, fishing villages and a busy port. Each monsoon the water "
      "rises and the farmers move their boats to higher ground. ";
  std::vector<TokenId> ids = shared_gemma3().tokenizer().encode("", true, false);  // BOS
  while (ids.size() < n) {
    const auto more = shared_gemma3().tokenizer().encode(text, false, false);
    ids.insert(ids.end(), more.begin(), more.end());
  }
  ids.resize(n);
  return ids;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

class Gemma3Forward : public ::testing::Test {
 protected:
  void SetUp() override { CF_REQUIRE_GEMMA3(); }
};

// The first entry sees only itself, so at every layer its key is a function of the token
// and its position alone: moving it must rotate by each layer's own RoPE base (10000 on
// local layers, 1e6 on global ones) to agree with computing it at the new position.
TEST_F(Gemma3Forward, MovedKeysUseEachLayersRopeBase) {
  const auto& h = shared_gemma3().hparams();
  ASSERT_NE(h.rope_base_of(0), h.rope_base_of(5));
  Forward fwd(shared_gemma3(), shared_pool());
  const auto ids = gemma_tokens(4);  // few rows: this one also runs under ASan
  const int32_t delta = 700;
  KvCache at_zero(h), at_delta(h);
  auto p0 = test::iota_positions(ids.size()), pd = test::iota_positions(ids.size(), delta);
  fwd.run(at_zero, {ids, p0, {}, {}});
  fwd.run(at_delta, {ids, pd, {}, {}});
  KvCache moved(h);
  moved.append_from(at_zero, 0, at_zero.size(), delta);
  for (int l = 0; l < h.n_layers; ++l) {
    const auto direct = test::k_rows(at_delta, l, 0);
    float scale = 0;
    for (float x : direct) scale = std::max(scale, std::fabs(x));
    EXPECT_LT(max_abs_diff(test::k_rows(moved, l, 0), direct), 2e-3f * scale) << "layer " << l;
    EXPECT_EQ(test::v_rows(moved, l, 0), test::v_rows(at_delta, l, 0)) << "layer " << l;
  }
}

// A row at position p of a local layer attends only to positions > p - 512; a global layer
// sees them all. Checked on the attention probabilities the forward pass reports.
TEST_F(Gemma3Forward, LocalLayersAttendOnlyWithinTheWindowSlow) {
  const auto& h = shared_gemma3().hparams();
  ASSERT_EQ(h.sliding_window, 512);
  ASSERT_TRUE(h.is_local(0));
  ASSERT_FALSE(h.is_local(5));
  Forward fwd(shared_gemma3(), shared_pool());
  const auto ids = gemma_tokens(640);
  auto pos = test::iota_positions(ids.size());
  const size_t last = ids.size() - 1;
  ForwardHooks hooks;
  hooks.rows = {last, 100};
  hooks.capture_attention = true;
  hooks.layers = {0, 5};
  hooks.stop_after_layer = 5;
  std::map<int, std::vector<float>> probs;
  hooks.on_layer = [&](const LayerTap& t) {
    probs[t.layer].assign(t.attn_probs, t.attn_probs + t.rows.size() * h.n_heads * t.n_entries);
  };
  KvCache cache(h);
  fwd.run(cache, {ids, pos, {}, {}}, &hooks);
  ASSERT_EQ(probs.size(), 2u);
  const size_t n = ids.size();
  const int32_t low = static_cast<int32_t>(last) - h.sliding_window;  // last invisible position
  for (int layer : {0, 5}) {
    double outside = 0, inside = 0, row100 = 0;
    for (int hh = 0; hh < h.n_heads; ++hh) {
      const float* p = &probs[layer][static_cast<size_t>(hh) * n];  // row `last`
      for (size_t e = 0; e < n; ++e) (cache.position(e) <= low ? outside : inside) += p[e];
      const float* q = &probs[layer][(static_cast<size_t>(h.n_heads) + hh) * n];  // row 100
      for (size_t e = 0; e <= 100; ++e) row100 += q[e];
    }
    EXPECT_NEAR(outside + inside, h.n_heads, 1e-3) << "layer " << layer;
    EXPECT_NEAR(row100, h.n_heads, 1e-3) << "layer " << layer << ": a row inside the window sees all before it";
    if (layer == 0)
      EXPECT_EQ(outside, 0.0) << "local layer 0 attends beyond its window";
    else
      EXPECT_GT(outside, 1e-3) << "global layer 5 should see the start of the sequence (BOS at least)";
  }
}

}  // namespace
}  // namespace cf

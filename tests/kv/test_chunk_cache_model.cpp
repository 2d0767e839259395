// Chunk caches computed by the real model: the store must give back exactly what the
// forward pass produced (f32) or its half-precision rounding (f16).
#include <gtest/gtest.h>

#include <numeric>

#include "base/thread_pool.h"
#include "kv/chunk_store.h"
#include "kv_test_util.h"
#include "test_support.h"

namespace cf {
namespace {

using test::max_abs_kv;
using test::max_kv_diff;

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Forward> fwd;
};

Loaded& loaded() {
  static Loaded l = [] {
    Loaded x;
    x.model = Model::load(test::default_model_path());
    x.pool = std::make_unique<ThreadPool>(2);
    x.fwd = std::make_unique<Forward>(*x.model, *x.pool);
    return x;
  }();
  return l;
}

// K/V of `tokens` run directly at start.. after `prefix` (at 0..), for comparison.
KvCache direct(const std::vector<TokenId>& prefix, const std::vector<TokenId>& tokens) {
  Loaded& l = loaded();
  std::vector<TokenId> all = prefix;
  all.insert(all.end(), tokens.begin(), tokens.end());
  std::vector<int32_t> pos(all.size());
  std::iota(pos.begin(), pos.end(), 0);
  KvCache kv(l.model->hparams(), all.size());
  ForwardInput in;
  in.tokens = all;
  in.positions = pos;
  l.fwd->run(kv, in);
  KvCache out(l.model->hparams(), tokens.size());
  out.append_from(kv, prefix.size(), all.size(), 0);
  return out;
}

TEST(ChunkCacheModel, PicCacheStoredAndReloaded) {
  CF_REQUIRE_MODEL();
  Loaded& l = loaded();
  const auto tokens = l.model->tokenizer().encode("Title: Carrow Lighthouse\nThe tower is 31 metres tall.\n\n", false, false);
  ASSERT_GT(tokens.size(), 5u);
  const ChunkKey key(l.model->fingerprint(), tokens);
  const ChunkCache c = compute_chunk_cache(*l.fwd, key);
  ASSERT_EQ(c.n_tokens(), tokens.size());
  for (size_t i = 0; i < c.n_tokens(); ++i) EXPECT_EQ(c.kv.position(i), static_cast<int32_t>(i));
  EXPECT_GT(c.offline_ms, 0);
  EXPECT_LE(max_kv_diff(c.kv, direct({}, tokens)), 1e-5f);
  ASSERT_GT(max_abs_kv(c.kv), 0.1f);  // real activations, not zeros

  for (KvDtype dtype : {KvDtype::f32, KvDtype::f16}) {
    test::TempDir dir;
    ChunkStoreOptions o;
    o.dir = dir.path();
    o.disk_dtype = dtype;
    o.model = StoreModel{l.model->fingerprint(), l.model->hparams()};
    ChunkStore(o).put(c);
    ChunkStore fresh(o);
    auto r = fresh.get(key);
    ASSERT_NE(r, nullptr) << dtype_name(dtype);
    EXPECT_EQ(fresh.stats().disk_hits, 1u);
    EXPECT_EQ(r->kv.positions(), c.kv.positions());
    EXPECT_EQ(r->kv.hparams().rope_base, l.model->hparams().rope_base);
    const float diff = max_kv_diff(r->kv, c.kv);
    if (dtype == KvDtype::f32)
      EXPECT_EQ(diff, 0.f);
    else
      EXPECT_LE(diff, max_abs_kv(c.kv) / 1024) << "f16 keeps 11 significant bits";
    KvCache rounded = c.kv;  // what the file should hold: the forward pass's K/V in dtype
    round_to_dtype(rounded, dtype);
    EXPECT_EQ(max_kv_diff(r->kv, rounded), 0.f) << dtype_name(dtype);
  }
}

TEST(ChunkCacheModel, AfterPrefixKeepsOnlyTheChunkAtItsPositions) {
  CF_REQUIRE_MODEL();
  Loaded& l = loaded();
  const auto& tok = l.model->tokenizer();
  const auto prefix = tok.encode("You answer questions about passages.\n", false, false);
  const auto tokens = tok.encode("Port Elwen was founded in 1742.\n", false, false);
  const ChunkKey key(l.model->fingerprint(), tokens, KeyContext::after_prefix(prefix));
  const ChunkCache c = compute_chunk_cache(*l.fwd, key, prefix);
  ASSERT_EQ(c.n_tokens(), tokens.size());
  EXPECT_EQ(c.kv.position(0), static_cast<int32_t>(prefix.size()));
  EXPECT_LE(max_kv_diff(c.kv, direct(prefix, tokens)), 1e-5f);
  // The prefix changes the chunk's K/V (that is why it is part of the key).
  const ChunkCache pic = compute_chunk_cache(*l.fwd, ChunkKey(l.model->fingerprint(), tokens));
  KvCache pic_moved(l.model->hparams(), tokens.size());
  pic_moved.append_from(pic.kv, 0, tokens.size(), static_cast<int32_t>(prefix.size()));
  EXPECT_GT(max_kv_diff(pic_moved, c.kv), 1e-2f);
  // The same thing through compute_chunk_cache_in_context, with the context restored after.
  KvCache ctx = direct({}, prefix);
  const ChunkCache c2 = compute_chunk_cache_in_context(*l.fwd, key, ctx, static_cast<int32_t>(prefix.size()));
  EXPECT_EQ(ctx.size(), prefix.size());
  EXPECT_LE(max_kv_diff(c2.kv, c.kv), 1e-5f);
  EXPECT_EQ(c2.kv.positions(), c.kv.positions());
  // A prefix that does not match the key, or a prefix for a PIC key, is refused.
  auto other = prefix;
  other.pop_back();
  EXPECT_THROW(compute_chunk_cache(*l.fwd, key, other), std::invalid_argument);
  EXPECT_THROW(compute_chunk_cache(*l.fwd, ChunkKey(l.model->fingerprint(), tokens), prefix), std::invalid_argument);
  EXPECT_THROW(compute_chunk_cache(*l.fwd, ChunkKey(l.model->fingerprint() ^ 1, tokens)), std::invalid_argument);
}

}  // namespace
}  // namespace cf

// The exact prefix cache (src/serve/prefix_cache.h): with the real model, what comes out of
// the tree is the K/V a fresh prefill computes; blocks are shared along common paths only;
// the budget evicts least recently used leaves; concurrent use returns consistent data.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "../runtime/kv_rows.h"
#include "../runtime/model_fixture.h"
#include "runtime/forward.h"
#include "serve/prefix_cache.h"

namespace cf {
namespace {

std::vector<TokenId> random_tokens(size_t n, uint32_t seed, int vocab = 49152) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<TokenId> dist(100, vocab - 1);
  std::vector<TokenId> t(n);
  for (auto& x : t) x = dist(rng);
  return t;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

KvCache full_prefill(Forward& fwd, const std::vector<TokenId>& tokens) {
  KvCache cache(fwd.model().hparams(), tokens.size());
  const auto pos = test::iota_positions(tokens.size());
  ForwardInput in;
  in.tokens = tokens;
  in.positions = pos;
  fwd.run(cache, in);
  return cache;
}

// Largest |a - b| over entries [0, n) of every layer's K and V; positions must agree.
float max_diff(const KvCache& a, const KvCache& b, size_t n) {
  EXPECT_GE(a.size(), n);
  EXPECT_GE(b.size(), n);
  float worst = 0;
  for (size_t s = 0; s < n; ++s) {
    EXPECT_EQ(a.position(s), b.position(s)) << "slot " << s;
    for (int l = 0; l < a.n_layers(); ++l) {
      const auto ak = test::k_rows(a, l, s), bk = test::k_rows(b, l, s);
      const auto av = test::v_rows(a, l, s), bv = test::v_rows(b, l, s);
      for (int d = 0; d < a.kv_dim(); ++d) {
        worst = std::max(worst, std::fabs(ak[d] - bk[d]));
        worst = std::max(worst, std::fabs(av[d] - bv[d]));
      }
    }
  }
  return worst;
}

// A model-shaped cache whose entries depend on the whole token prefix up to them, like
// real K/V (identical prefixes give identical entries), but cheap: for the tests of the
// tree's bookkeeping, where running the model adds nothing.
ModelHparams small_shape() {
  ModelHparams h;
  h.n_layers = 2;
  h.n_heads = 2;
  h.n_kv_heads = 1;
  h.head_dim = 8;
  h.d_model = 16;
  h.vocab_size = 1000;
  return h;
}

KvCache synthetic_cache(const ModelHparams& h, const std::vector<TokenId>& tokens) {
  KvCache c(h);
  c.append(tokens.size());
  uint64_t hash = 1469598103934665603ull;
  std::vector<float> k(h.kv_dim()), v(h.kv_dim());
  for (size_t s = 0; s < tokens.size(); ++s) {
    hash = (hash ^ static_cast<uint64_t>(tokens[s])) * 1099511628211ull;
    c.set_position(s, static_cast<int32_t>(s));
    for (int l = 0; l < h.n_layers; ++l) {
      for (int d = 0; d < h.kv_dim(); ++d) {
        k[d] = static_cast<float>((hash >> (d % 40)) % 4096) + static_cast<float>(l);
        v[d] = -k[d];
      }
      c.write_k(l, s, 1, k.data());
      c.write_v(l, s, 1, v.data());
    }
  }
  return c;
}

size_t block_bytes(const ModelHparams& h, size_t block_tokens) {
  return 2 * static_cast<size_t>(h.n_layers) * block_tokens * h.kv_dim() * KvCache::kValueBytes;
}

TEST(PrefixCache, LookupGivesTheKvOfAFreshPrefillOfTheSharedPrefix) {
  CF_REQUIRE_MODEL();
  Forward fwd(test::shared_model(), test::shared_pool());
  const auto& h = test::shared_model().hparams();
  PrefixCache pc(h);
  const auto shared = random_tokens(50, 1);
  const auto a = concat(shared, random_tokens(20, 2));
  const auto b = concat(shared, random_tokens(14, 3));
  pc.insert(a, full_prefill(fwd, a));
  EXPECT_EQ(pc.stats().blocks, 4u);  // 70 tokens: 4 whole blocks of 16

  KvCache got(h);
  EXPECT_EQ(pc.lookup(b, got), 48u);  // the 3 whole blocks inside the 50 shared tokens
  EXPECT_EQ(got.size(), 48u);
  const KvCache fresh = full_prefill(fwd, b);
  EXPECT_EQ(max_diff(got, fresh, 48), 0.f);

  const PrefixCacheStats s = pc.stats();
  EXPECT_EQ(s.lookups, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.lookup_tokens, b.size());
  EXPECT_EQ(s.hit_tokens, 48u);
  EXPECT_EQ(s.bytes, 4 * block_bytes(h, 16));
}

TEST(PrefixCache, OnlyWholeBlocksAreStoredAndServed) {
  const ModelHparams h = small_shape();
  PrefixCache pc(h);
  const auto t = random_tokens(40, 4, h.vocab_size);
  const auto short_t = std::vector<TokenId>(t.begin(), t.begin() + 15);
  pc.insert(short_t, synthetic_cache(h, short_t));
  EXPECT_EQ(pc.stats().blocks, 0u);
  KvCache none(h);
  EXPECT_EQ(pc.lookup(t, none), 0u);
  EXPECT_EQ(pc.stats().hits, 0u);

  const KvCache ref = synthetic_cache(h, t);
  pc.insert(t, ref);
  EXPECT_EQ(pc.stats().blocks, 2u);
  KvCache all(h), part(h);
  EXPECT_EQ(pc.lookup(t, all), 32u);
  EXPECT_EQ(max_diff(all, ref, 32), 0.f);
  EXPECT_EQ(pc.lookup(std::span(t).first(31), part), 16u);  // 31 tokens hold one whole block
  // A cache that does not start at position 0 is refused.
  KvCache shifted = synthetic_cache(h, t);
  shifted.shift(0, shifted.size(), 5);
  EXPECT_THROW(pc.insert(t, shifted), std::invalid_argument);
  KvCache not_empty(h);
  not_empty.append(1);
  EXPECT_THROW(pc.lookup(t, not_empty), std::invalid_argument);
}

TEST(PrefixCache, DivergentSuffixesShareOnlyTheCommonBlocks) {
  const ModelHparams h = small_shape();
  PrefixCache pc(h);
  const auto p = random_tokens(40, 5, h.vocab_size);  // 2.5 blocks
  const auto a = concat(p, random_tokens(40, 6, h.vocab_size));
  const auto b = concat(p, random_tokens(40, 7, h.vocab_size));
  const KvCache ra = synthetic_cache(h, a), rb = synthetic_cache(h, b);
  pc.insert(a, ra);
  pc.insert(b, rb);
  // 5 blocks each; the first 2 are common, the third already differs in its last 8 tokens.
  EXPECT_EQ(pc.stats().blocks, 8u);
  EXPECT_EQ(pc.stats().inserted_blocks, 8u);
  pc.insert(a, ra);  // present already: nothing new
  EXPECT_EQ(pc.stats().inserted_blocks, 8u);
  KvCache ga(h), gb(h);
  EXPECT_EQ(pc.lookup(a, ga), 80u);
  EXPECT_EQ(pc.lookup(b, gb), 80u);
  EXPECT_EQ(max_diff(ga, ra, 80), 0.f);
  EXPECT_EQ(max_diff(gb, rb, 80), 0.f);
  EXPECT_GT(max_diff(ga, gb, 48), 0.f);  // the third blocks are different nodes
}

TEST(PrefixCache, BudgetEvictsLeastRecentlyUsedLeaves) {
  const ModelHparams h = small_shape();
  PrefixCacheOptions opt;
  opt.budget_bytes = 4 * block_bytes(h, opt.block_tokens);
  PrefixCache pc(h, opt);
  const auto a = random_tokens(48, 8, h.vocab_size), b = random_tokens(48, 9, h.vocab_size),
             c = random_tokens(32, 10, h.vocab_size);
  pc.insert(a, synthetic_cache(h, a));
  pc.insert(b, synthetic_cache(h, b));  // 6 blocks > 4: a's two deepest blocks go
  PrefixCacheStats s = pc.stats();
  EXPECT_EQ(s.blocks, 4u);
  EXPECT_LE(s.bytes, s.budget_bytes);
  EXPECT_EQ(s.evicted_blocks, 2u);
  KvCache ga(h), gb(h);
  EXPECT_EQ(pc.lookup(a, ga), 16u);  // a's root block stays: it is a parent until its leaf goes
  EXPECT_EQ(pc.lookup(b, gb), 48u);

  KvCache again(h);
  EXPECT_EQ(pc.lookup(a, again), 16u);  // a is now the most recently used
  pc.insert(c, synthetic_cache(h, c));  // 6 blocks: b's two deepest are the LRU leaves
  s = pc.stats();
  EXPECT_EQ(s.blocks, 4u);
  EXPECT_EQ(s.evicted_blocks, 4u);
  KvCache la(h), lb(h), lc(h);
  EXPECT_EQ(pc.lookup(a, la), 16u);
  EXPECT_EQ(pc.lookup(b, lb), 16u);
  EXPECT_EQ(pc.lookup(c, lc), 32u);
  EXPECT_EQ(max_diff(lc, synthetic_cache(h, c), 32), 0.f);

  pc.clear();
  EXPECT_EQ(pc.stats().blocks, 0u);
  EXPECT_EQ(pc.stats().bytes, 0u);
  KvCache gone(h);
  EXPECT_EQ(pc.lookup(c, gone), 0u);
}

TEST(PrefixCache, ConcurrentLookupsAndInsertsStayConsistent) {
  const ModelHparams h = small_shape();
  PrefixCacheOptions opt;
  opt.block_tokens = 4;
  opt.budget_bytes = 24 * block_bytes(h, opt.block_tokens);  // small: evictions run throughout
  PrefixCache pc(h, opt);
  // Sequences sharing prefixes of varied length, and their reference caches.
  std::vector<std::vector<TokenId>> seqs;
  std::vector<KvCache> refs;
  const auto trunk = random_tokens(32, 11, h.vocab_size);
  for (uint32_t i = 0; i < 12; ++i) {
    const size_t keep = 4 * (i % 6) + i % 3;
    auto s = concat(std::vector<TokenId>(trunk.begin(), trunk.begin() + keep), random_tokens(20 + i, 100 + i, h.vocab_size));
    refs.push_back(synthetic_cache(h, s));
    seqs.push_back(std::move(s));
  }
  std::atomic<int> mismatches{0}, hits{0};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int it = 0; it < 400; ++it) {
        const size_t i = rng() % seqs.size();
        KvCache got(h);
        const size_t n = pc.lookup(seqs[i], got);
        if (n % opt.block_tokens != 0 || n > seqs[i].size() || got.size() != n) ++mismatches;
        if (n > 0) ++hits;
        for (size_t s = 0; s < n; ++s)
          for (int l = 0; l < h.n_layers; ++l)
            if (!std::equal(got.k_f16(l, s), got.k_f16(l, s) + h.kv_dim(), refs[i].k_f16(l, s)) ||
                !std::equal(got.v_f16(l, s), got.v_f16(l, s) + h.kv_dim(), refs[i].v_f16(l, s)) ||
                got.position(s) != static_cast<int32_t>(s))
              ++mismatches;
        if (rng() % 2) pc.insert(seqs[i], refs[i]);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GT(hits.load(), 0);
  const PrefixCacheStats s = pc.stats();
  EXPECT_LE(s.bytes, s.budget_bytes);
  EXPECT_EQ(s.lookups, 1600u);
  EXPECT_GT(s.evicted_blocks, 0u);
  EXPECT_EQ(s.inserted_blocks - s.evicted_blocks, s.blocks);
}

TEST(PrefixCache, PrefixSourcePrefillsTheRestExactlyAndReportsHits) {
  CF_REQUIRE_MODEL();
  Forward fwd(test::shared_model(), test::shared_pool());
  const auto& h = test::shared_model().hparams();
  PrefixCache pc(h);
  const auto system = random_tokens(40, 12);
  const auto t1 = concat(system, random_tokens(25, 13));
  const auto t2 = concat(system, random_tokens(30, 14));

  size_t hit = 99;
  auto c1 = pc.prefix(fwd, t1, hit);
  EXPECT_EQ(hit, 0u);
  ASSERT_EQ(c1->size(), t1.size());
  EXPECT_EQ(max_diff(*c1, full_prefill(fwd, t1), t1.size()), 0.f);  // the same computation

  auto c2 = pc.prefix(fwd, t2, hit);
  EXPECT_EQ(hit, 32u);  // two whole blocks of the shared 40 tokens
  ASSERT_EQ(c2->size(), t2.size());
  const KvCache fresh2 = full_prefill(fwd, t2);
  EXPECT_EQ(max_diff(*c2, fresh2, t2.size()), 0.f);

  auto c3 = pc.prefix(fwd, t2, hit);
  EXPECT_EQ(hit, 64u);  // all 4 whole blocks of t2 now
  EXPECT_EQ(max_diff(*c3, fresh2, t2.size()), 0.f);

  // Exact to the bit (the kernels are batch-invariant, runtime/forward.h), so decoding on
  // from the cached prefix gives the plain prefill's logits.
  KvCache dec_cached(h), dec_fresh(h);
  dec_cached.append_from(*c3, 0, c3->size(), 0);
  dec_fresh.append_from(fresh2, 0, fresh2.size(), 0);
  const TokenId next[] = {1234};
  const int32_t pos[] = {static_cast<int32_t>(t2.size())};
  const size_t rows[] = {0};
  ForwardInput in;
  in.tokens = next;
  in.positions = pos;
  in.logit_rows = rows;
  const auto la = fwd.run(dec_cached, in).logits;
  const auto lb = fwd.run(dec_fresh, in).logits;
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(la, lb);

  size_t empty_hit = 7;
  EXPECT_EQ(pc.prefix(fwd, {}, empty_hit)->size(), 0u);
  EXPECT_EQ(empty_hit, 0u);
}

}  // namespace
}  // namespace cf

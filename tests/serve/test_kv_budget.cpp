// One K/V budget for the running requests and the caches (serve/kv_budget.h, issue 58 item 3),
// on the real prefix cache and chunk store with a small synthetic model shape (no model file):
// a job that does not fit beside the caches is admitted once they give back, the caches then
// holding fewer bytes (the store demoting, its files kept); reservations + cached bytes never
// exceed the budget through a sequence of admissions, releases and cache inserts; a running
// job's reservation is never reduced for a cache; an entry a prefill holds stays whole when evicted.
#include "serve/kv_budget.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "../kv/kv_test_util.h"
#include "kv/chunk_store.h"
#include "serve/prefix_cache.h"

namespace cf {
namespace {

using test::synthetic_cache;
using test::tiny_hparams;
using test::tiny_key;

constexpr size_t kUncapped = size_t{1} << 40;  // the caches' own caps out of the way: the budget binds

// The two caches of the engine under one budget, as Engine::Impl wires them.
struct Caches {
  test::TempDir dir;
  KvBudget budget;
  std::unique_ptr<PrefixCache> prefixes;
  std::unique_ptr<ChunkStore> store;

  explicit Caches(size_t budget_bytes) : budget(budget_bytes) {
    PrefixCacheOptions po{16, kUncapped, &budget.add_cache("prefix_cache", [this](size_t n) { return prefixes->release(n); })};
    prefixes = std::make_unique<PrefixCache>(tiny_hparams(), po);
    ChunkStoreOptions so;
    so.dir = dir.path();
    so.durable = false;
    so.model = StoreModel{test::kTinyFingerprint, tiny_hparams()};
    so.memory_budget_bytes = kUncapped;
    so.memory_account = &budget.add_cache("chunk_store", [this](size_t n) { return store->release_memory(n); });
    store = std::make_unique<ChunkStore>(so);
  }
  size_t held() const { return prefixes->stats().bytes + store->stats().memory_bytes; }

  // A prompt of `n` tokens (seeded) with exact-looking K/V at positions 0..n-1, inserted.
  void insert_prefix(int seed, size_t n) {
    const std::vector<TokenId> tokens = test::tokens_for(seed, n);
    KvCache kv(tiny_hparams(), n);
    kv.append(n);
    for (size_t i = 0; i < n; ++i) kv.set_position(i, static_cast<int32_t>(i));
    prefixes->insert(tokens, kv);
  }
  ChunkKey put_chunk(int seed, size_t n) {
    const ChunkKey key = tiny_key(seed, n);
    store->put(synthetic_cache(key, tiny_hparams()));
    return key;
  }
};

size_t prefix_block_bytes() { return 2 * 3 * 16 * 16 * KvCache::kValueBytes; }  // tiny_hparams: 3 layers, kv_dim 16

TEST(KvBudget, AJobThatDoesNotFitBesideTheCachesIsAdmittedOnceTheyGiveBack) {
  const size_t budget = 100 * prefix_block_bytes();
  Caches c(budget);
  for (int i = 0; i < 2; ++i) c.insert_prefix(i, 64);  // 8 blocks
  std::vector<ChunkKey> chunks;
  for (int i = 0; i < 6; ++i) chunks.push_back(c.put_chunk(100 + i, 160));  // the largest holder
  const size_t held_before = c.held();
  ASSERT_EQ(c.budget.cached_bytes(), held_before);
  ASSERT_GT(c.store->stats().memory_bytes, c.prefixes->stats().bytes);
  ASSERT_GT(held_before, budget / 2);

  // A prefill holding chunk caches while they are evicted: its copies stay whole (the store hands
  // out immutable entries by shared_ptr; eviction drops the store's reference only).
  std::vector<std::shared_ptr<const ChunkCache>> in_use;
  for (const ChunkKey& k : chunks) in_use.push_back(c.store->get(k));
  const size_t running = 10 * prefix_block_bytes();
  ASSERT_TRUE(c.budget.try_reserve(running));  // fits in what the caches leave free
  ASSERT_EQ(c.budget.admission_evicted_bytes(), 0u);
  const size_t job = budget - running - held_before / 2;  // fits beside the reservation, not beside the caches
  ASSERT_GT(running + job + held_before, budget);
  ASSERT_TRUE(c.budget.try_reserve(job));

  EXPECT_EQ(c.budget.reserved_bytes(), running + job);
  EXPECT_LT(c.held(), held_before);
  EXPECT_LE(c.budget.reserved_bytes() + c.held(), budget);
  EXPECT_EQ(c.budget.cached_bytes(), c.held());
  EXPECT_EQ(c.budget.admission_evicted_bytes(), held_before - c.held());
  // The largest holder gave back, by demotion: every chunk's file is still there and loads.
  const ChunkStoreStats st = c.store->stats();
  EXPECT_GT(st.demotions, 0u);
  EXPECT_EQ(st.evictions_disk, 0u);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkCache expected = synthetic_cache(chunks[i], tiny_hparams());
    ASSERT_NE(in_use[i], nullptr);
    EXPECT_EQ(test::max_kv_diff(in_use[i]->kv, expected.kv), 0.f) << "a held entry changed under eviction";
    EXPECT_TRUE(c.store->contains(chunks[i]));
    EXPECT_NE(c.store->get(chunks[i]), nullptr) << chunks[i].id();
  }
  EXPECT_LE(c.budget.reserved_bytes() + c.held(), budget);  // the reloads took free room only
}

TEST(KvBudget, ReservationsAndCachedBytesNeverExceedTheBudget) {
  const size_t budget = 60 * prefix_block_bytes();
  Caches c(budget);
  std::mt19937 rng(58);
  std::vector<size_t> reservations;
  std::vector<ChunkKey> keys;
  size_t admitted = 0, waited = 0;
  for (int step = 0; step < 400; ++step) {
    switch (rng() % 6) {
      case 0:
      case 1: {  // a job arrives
        const size_t bytes = (1 + rng() % 30) * prefix_block_bytes() / 2;
        if (c.budget.try_reserve(bytes)) {
          reservations.push_back(bytes);
          ++admitted;
        } else {
          ++waited;
        }
        break;
      }
      case 2:  // a job finishes
        if (!reservations.empty()) {
          const size_t i = rng() % reservations.size();
          c.budget.release(reservations[i]);
          reservations.erase(reservations.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      case 3:
        c.insert_prefix(static_cast<int>(rng() % 40), 16 * (1 + rng() % 6));
        break;
      case 4:
        keys.push_back(c.put_chunk(1000 + static_cast<int>(rng() % 40), 20 + rng() % 100));
        break;
      default:  // a reload from the disk tier into memory
        if (!keys.empty()) {
          EXPECT_NE(c.store->get(keys[rng() % keys.size()]), nullptr);
        }
    }
    size_t reserved = 0;
    for (size_t r : reservations) reserved += r;
    ASSERT_EQ(c.budget.reserved_bytes(), reserved) << "step " << step;
    ASSERT_EQ(c.budget.cached_bytes(), c.held()) << "step " << step;
    ASSERT_LE(reserved + c.held(), budget) << "step " << step;
  }
  EXPECT_GT(admitted, 20u);
  EXPECT_GT(waited, 0u);
  EXPECT_GT(c.budget.admission_evicted_bytes(), 0u);
}

TEST(KvBudget, ARunningJobsReservationIsNeverReducedForACache) {
  const size_t budget = 40 * prefix_block_bytes();
  Caches c(budget);
  const size_t running = 30 * prefix_block_bytes();
  ASSERT_TRUE(c.budget.try_reserve(running));
  // Far more cached K/V than the 10 blocks left: the caches take what is free and no more.
  for (int i = 0; i < 8; ++i) c.insert_prefix(i, 64);
  for (int i = 0; i < 8; ++i) c.put_chunk(200 + i, 64);
  EXPECT_EQ(c.budget.reserved_bytes(), running);
  EXPECT_LE(c.held(), budget - running);
  EXPECT_GT(c.held(), 0u);
  EXPECT_GT(c.budget.refused_charges(), 0u);
  // A job that fits only if the running one gave up its room waits, and nothing is evicted for it.
  const size_t held = c.held();
  EXPECT_FALSE(c.budget.try_reserve(budget - running + 1));
  EXPECT_EQ(c.budget.reserved_bytes(), running);
  EXPECT_EQ(c.held(), held);
  EXPECT_EQ(c.budget.admission_evicted_bytes(), 0u);
  // Once the running job finishes, it is admitted.
  c.budget.release(running);
  EXPECT_TRUE(c.budget.try_reserve(budget - running + 1));
  EXPECT_LE(c.budget.reserved_bytes() + c.held(), budget);
}

TEST(KvBudget, CapsAndDefaults) {
  size_t budget = kKvBudgetDefault, memory = kKvBudgetDefault, prefix = size_t{64} << 20;
  EXPECT_EQ(resolve_kv_budgets(budget, memory, prefix), default_kv_budget_bytes());
  EXPECT_EQ(memory, budget);           // not given: all of the budget
  EXPECT_EQ(prefix, size_t{64} << 20);  // given: the user's cap stays
  budget = 0;
  memory = prefix = kKvBudgetDefault;
  resolve_kv_budgets(budget, memory, prefix);
  EXPECT_EQ(memory, size_t{1} << 30);  // unbounded budget: the fixed defaults
  EXPECT_EQ(prefix, size_t{256} << 20);
  KvBudget unbounded(0);
  EXPECT_TRUE(unbounded.try_reserve(size_t{1} << 50));
}

}  // namespace
}  // namespace cf

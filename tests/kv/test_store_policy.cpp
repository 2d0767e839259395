// Cache management of the chunk store (Cache-Craft §3.3-3.5): f_r eviction vs LRU, demotion
// to the disk tier, disk/entry budgets, asynchronous prefetch, Eq. 16. Real files in a temp
// directory throughout.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "kv/chunk_store.h"
#include "kv_test_util.h"

namespace cf {
namespace {

namespace fs = std::filesystem;
using test::synthetic_cache;
using test::tiny_hparams;
using test::tiny_key;

ChunkStoreOptions options(const std::string& dir, EvictionPolicy policy) {
  ChunkStoreOptions o;
  o.dir = dir;
  o.durable = false;  // atomic all the same; the tests need no fsync
  o.eviction = policy;
  o.model = StoreModel{test::kTinyFingerprint, tiny_hparams()};
  return o;
}

size_t memory_size(const ChunkKey& k) { return synthetic_cache(k, tiny_hparams()).memory_bytes(); }

bool in_memory(ChunkStore& s, const ChunkKey& k) {
  const auto before = s.stats().memory_hits;
  const bool hit = s.get(k) != nullptr && s.stats().memory_hits == before + 1;
  return hit;
}

TEST(StorePolicy, PolicyNames) {
  EvictionPolicy p = EvictionPolicy::lru;
  EXPECT_TRUE(parse_eviction_policy("cachecraft", p));
  EXPECT_EQ(p, EvictionPolicy::cachecraft);
  EXPECT_STREQ(eviction_policy_name(p), "cachecraft");
  EXPECT_TRUE(parse_eviction_policy("lru", p));
  EXPECT_EQ(p, EvictionPolicy::lru);
  EXPECT_FALSE(parse_eviction_policy("lfu", p));
  EXPECT_EQ(ChunkStoreOptions{}.eviction, EvictionPolicy::lru);  // today's behaviour by default
}

TEST(StorePolicy, LayerwisePreloadDepthIsEquation16) {
  EXPECT_EQ(preload_layers(5, 1.0, 2.0), 3);     // the paper's Fig. 19: 5 layers at 1:2
  EXPECT_EQ(preload_layers(32, 0.26, 1.0), 24);  // Sys-X from SSD: 24 of 32 layers
  EXPECT_EQ(preload_layers(30, 2.0, 1.0), 1);    // prefill slower than loading (our CPU case)
  EXPECT_EQ(preload_layers(30, 1.0, 1.0), 1);
  EXPECT_EQ(preload_layers(30, 0.0, 1.0), 30);   // free compute: load everything ahead
  EXPECT_EQ(preload_layers(5, 1.0, 0.0), 1);     // nothing to load
  EXPECT_EQ(preload_layers(5, 1.0, 3.0), 4);     // 4 * 2/3 + 1 = 3.67, rounded up
}

// Three entries fit in memory. k0 is the least recently used but the most reused; k1 was
// just read but never credited. cachecraft drops k1, lru drops k0; both only demote.
class MemoryEviction : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(MemoryEviction, DropsLowestScoreOrLeastRecentAndKeepsTheFile) {
  test::TempDir dir;
  const ChunkKey k0 = tiny_key(10), k1 = tiny_key(11), k2 = tiny_key(12), k3 = tiny_key(13);
  ChunkStoreOptions o = options(dir.path(), GetParam());
  o.memory_budget_bytes = 3 * memory_size(k0) + memory_size(k0) / 2;
  ChunkStore s(o);
  for (const auto& k : {k0, k1, k2}) s.put(synthetic_cache(k, tiny_hparams()));
  EXPECT_DOUBLE_EQ(s.score(k0.id()), 1.0);  // the seed of a new entry
  s.note_use(k0, 0.1);                       // +10
  s.note_use(k2, 0.5);                       // +2
  s.note_use(k2.id(), 0.0);                  // a perfect match: +1/cfo_floor = +100, not inf
  EXPECT_DOUBLE_EQ(s.score(k0.id()), 11.0);
  EXPECT_DOUBLE_EQ(s.score(k2.id()), 103.0);
  EXPECT_EQ(s.score("00000000000000000000000000000000"), 0.0);  // unknown ids are ignored
  ASSERT_NE(s.get(k1), nullptr);  // recency now: k1 k2 k0
  s.put(synthetic_cache(k3, tiny_hparams()));

  const ChunkKey& gone = GetParam() == EvictionPolicy::cachecraft ? k1 : k0;
  auto st = s.stats();
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.demotions, 1u);
  EXPECT_EQ(st.evictions_disk, 0u);
  EXPECT_EQ(st.memory_entries, 3u);
  EXPECT_EQ(st.disk_entries, 4u);
  EXPECT_EQ(st.entries, 4u);
  EXPECT_TRUE(fs::exists(s.path_for(gone.id())));  // demoted, not deleted
  const double score_before = s.score(gone.id());
  for (const auto& k : {k0, k1, k2, k3}) {
    if (!(k == gone)) {
      EXPECT_TRUE(in_memory(s, k)) << k.id();
    }
  }
  // The demoted entry comes back from its file, with its f_r.
  const auto disk_hits = s.stats().disk_hits;
  auto back = s.get(gone);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(s.stats().disk_hits, disk_hits + 1);
  EXPECT_EQ(back->key.id(), gone.id());
  EXPECT_DOUBLE_EQ(s.score(gone.id()), score_before);
}

INSTANTIATE_TEST_SUITE_P(Policies, MemoryEviction, ::testing::Values(EvictionPolicy::lru, EvictionPolicy::cachecraft),
                         [](const auto& info) { return std::string(eviction_policy_name(info.param)); });

TEST(StorePolicy, CachecraftTiesGoToTheLeastRecent) {
  const ChunkKey k0 = tiny_key(20), k1 = tiny_key(21), k2 = tiny_key(22);
  ChunkStoreOptions o = options("", EvictionPolicy::cachecraft);  // memory only
  o.memory_budget_bytes = 2 * memory_size(k0) + memory_size(k0) / 2;
  ChunkStore s(o);
  s.put(synthetic_cache(k0, tiny_hparams()));
  s.put(synthetic_cache(k1, tiny_hparams()));
  ASSERT_NE(s.get(k0), nullptr);  // equal scores; k1 is now the least recent
  s.put(synthetic_cache(k2, tiny_hparams()));
  EXPECT_EQ(s.get(k1), nullptr);
  EXPECT_NE(s.get(k0), nullptr);
  const auto st = s.stats();
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.demotions, 0u);  // no disk tier: the entry is gone
  EXPECT_EQ(s.score(k1.id()), 0.0);
}

TEST(StorePolicy, ScoresOutliveTheProcessUnderCachecraftOnly) {
  test::TempDir dir;
  const ChunkKey k0 = tiny_key(30), k1 = tiny_key(31);
  {
    ChunkStore s(options(dir.path(), EvictionPolicy::cachecraft));
    s.put(synthetic_cache(k0, tiny_hparams()));
    s.put(synthetic_cache(k1, tiny_hparams()));
    s.note_use(k0, 0.25);
  }
  ASSERT_TRUE(fs::exists(dir.path() + "/fr-scores.json"));
  {
    ChunkStore s(options(dir.path(), EvictionPolicy::cachecraft));
    EXPECT_DOUBLE_EQ(s.score(k0.id()), 5.0);
    EXPECT_DOUBLE_EQ(s.score(k1.id()), 1.0);
    EXPECT_EQ(s.stats().disk_entries, 2u);
    EXPECT_TRUE(s.remove(k1.id()));
    EXPECT_EQ(s.score(k1.id()), 0.0);
    EXPECT_EQ(s.remove_all(), 1u);
  }
  EXPECT_FALSE(fs::exists(dir.path() + "/fr-scores.json"));  // remove_all, then nothing to save

  // A damaged score file costs the scores, nothing else.
  {
    ChunkStore s(options(dir.path(), EvictionPolicy::cachecraft));
    s.put(synthetic_cache(k0, tiny_hparams()));
    s.note_use(k0, 0.5);
  }
  std::ofstream(dir.path() + "/fr-scores.json", std::ios::trunc) << "{\"scores\": [not json";
  std::vector<std::string> reports;
  ChunkStoreOptions o = options(dir.path(), EvictionPolicy::cachecraft);
  o.report = [&](const std::string& line) { reports.push_back(line); };
  {
    ChunkStore s(o);
    EXPECT_DOUBLE_EQ(s.score(k0.id()), 1.0);
    EXPECT_NE(s.get(k0), nullptr);
  }
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].find("f_r scores"), std::string::npos);

  test::TempDir lru_dir;
  {
    ChunkStore s(options(lru_dir.path(), EvictionPolicy::lru));
    s.put(synthetic_cache(k0, tiny_hparams()));
    s.note_use(k0, 0.25);
  }
  EXPECT_FALSE(fs::exists(lru_dir.path() + "/fr-scores.json"));
}

size_t file_size_of(const ChunkKey& k) { return encode_cache_file(synthetic_cache(k, tiny_hparams()), KvDtype::f16).size(); }

// Memory holds one entry, the disk budget three files: the fourth put deletes a demoted
// file for real, the lowest-scored one (cachecraft; ties to the least recent) or the least
// recently used (lru).
class DiskBudget : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(DiskBudget, DeletesTheLowestScoredDemotedFile) {
  test::TempDir dir;
  const ChunkKey k0 = tiny_key(40), k1 = tiny_key(41), k2 = tiny_key(42), k3 = tiny_key(43);
  const size_t file = file_size_of(k0);
  ChunkStoreOptions o = options(dir.path(), GetParam());
  o.memory_budget_bytes = memory_size(k0) + memory_size(k0) / 2;
  o.disk_budget_bytes = 3 * file + file / 2;
  ChunkStore s(o);
  for (const auto& k : {k0, k1, k2}) s.put(synthetic_cache(k, tiny_hparams()));
  EXPECT_EQ(s.stats().disk_bytes, 3 * file);
  EXPECT_EQ(s.stats().demotions, 2u);
  s.note_use(k0, 0.1);
  s.put(synthetic_cache(k3, tiny_hparams()));  // demotes k2, then one file must go

  const ChunkKey& gone = GetParam() == EvictionPolicy::cachecraft ? k1 : k0;
  auto st = s.stats();
  EXPECT_EQ(st.evictions_disk, 1u);
  EXPECT_EQ(st.disk_entries, 3u);
  EXPECT_EQ(st.disk_bytes, 3 * file);
  EXPECT_LE(st.disk_bytes, o.disk_budget_bytes);
  EXPECT_FALSE(fs::exists(s.path_for(gone.id())));
  EXPECT_EQ(s.score(gone.id()), 0.0);  // deleted for real: its f_r goes with it
  EXPECT_EQ(s.get(gone), nullptr);
  for (const auto& k : {k0, k1, k2, k3}) {
    if (!(k == gone)) {
      EXPECT_NE(s.get(k), nullptr) << k.id();
    }
  }
  EXPECT_EQ(s.list().size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Policies, DiskBudget, ::testing::Values(EvictionPolicy::lru, EvictionPolicy::cachecraft),
                         [](const auto& info) { return std::string(eviction_policy_name(info.param)); });

// Issue 59: Cache-Craft's variants (after-prefix caches of a chunk, one file each) are store
// entries like any other: they count in the disk budget, and past it files go as for any
// entry, so a flood of fused requests with new prefixes cannot grow the store past --disk-budget.
TEST(StorePolicy, VariantFilesCountInTheDiskBudget) {
  test::TempDir dir;
  const ChunkKey pic = tiny_key(60);
  const size_t file = file_size_of(pic);
  ChunkStoreOptions o = options(dir.path(), EvictionPolicy::cachecraft);
  o.memory_budget_bytes = memory_size(pic) + memory_size(pic) / 2;
  o.disk_budget_bytes = 4 * file + file / 2;
  ChunkStore s(o);
  s.put(synthetic_cache(pic, tiny_hparams()));
  for (int v = 0; v < 12; ++v) {  // 12 variants of one chunk, each after another prefix
    const std::vector<TokenId> prefix{1000 + v, 7, 8};
    const ChunkKey variant = tiny_key(60, 5, KeyContext::after_prefix(prefix));
    ASSERT_EQ(file_size_of(variant), file);
    s.put(synthetic_cache(variant, tiny_hparams()));
    EXPECT_LE(s.stats().disk_bytes, o.disk_budget_bytes) << "after variant " << v;
  }
  const auto st = s.stats();
  EXPECT_EQ(st.disk_entries, 4u);
  EXPECT_GE(st.evictions_disk, 9u);
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.path()))
    files += e.is_regular_file() && e.path().extension() == ".cfkv";
  EXPECT_EQ(files, 4u);  // what the store counts is what is on disk
}

// Cache-Craft's global N x M instance budget: all five entries fit in memory, at most three
// may exist. Demoted entries go before resident ones, whatever their scores.
TEST(StorePolicy, EntryBudgetDeletesDemotedThenLowestScored) {
  test::TempDir dir;
  std::vector<ChunkKey> k;
  for (int i = 0; i < 6; ++i) k.push_back(tiny_key(50 + i));
  ChunkStoreOptions o = options(dir.path(), EvictionPolicy::cachecraft);
  o.max_entries = 3;
  ChunkStore s(o);
  for (int i = 0; i < 3; ++i) s.put(synthetic_cache(k[i], tiny_hparams()));
  s.note_use(k[0], 0.5);  // 3
  s.note_use(k[2], 0.2);  // 6; k[1] keeps 1
  s.put(synthetic_cache(k[3], tiny_hparams()));  // all resident: the lowest f_r goes
  EXPECT_EQ(s.stats().evictions_disk, 1u);
  EXPECT_EQ(s.stats().entries, 3u);
  EXPECT_FALSE(fs::exists(s.path_for(k[1].id())));
  EXPECT_EQ(s.get(k[1]), nullptr);

  // Demote everything, then bring back two: k[2], the best scored, is the one left on disk only.
  s.clear_memory();
  ASSERT_NE(s.get(k[0]), nullptr);
  ASSERT_NE(s.get(k[3]), nullptr);
  s.put(synthetic_cache(k[4], tiny_hparams()));
  EXPECT_EQ(s.stats().evictions_disk, 2u);
  EXPECT_FALSE(fs::exists(s.path_for(k[2].id())));  // demoted, so it went first
  EXPECT_TRUE(fs::exists(s.path_for(k[0].id())));
  EXPECT_TRUE(fs::exists(s.path_for(k[3].id())));
  EXPECT_EQ(s.stats().entries, 3u);

  // Without a disk tier the entry budget bounds the memory tier.
  ChunkStoreOptions m = options("", EvictionPolicy::lru);
  m.max_entries = 2;
  ChunkStore mem(m);
  for (int i = 0; i < 3; ++i) mem.put(synthetic_cache(k[i], tiny_hparams()));
  EXPECT_EQ(mem.stats().memory_entries, 2u);
  EXPECT_EQ(mem.stats().evictions, 1u);
  EXPECT_EQ(mem.get(k[0]), nullptr);
}

TEST(StorePolicy, ReopenedStoreKnowsItsFilesAndTheirWriteOrder) {
  test::TempDir dir;
  const ChunkKey k0 = tiny_key(60), k1 = tiny_key(61), k2 = tiny_key(62), k3 = tiny_key(63);
  const size_t file = file_size_of(k0);
  {
    ChunkStore s(options(dir.path(), EvictionPolicy::lru));
    for (const auto& k : {k0, k1, k2}) {
      s.put(synthetic_cache(k, tiny_hparams()));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // distinct modification times
    }
  }
  ChunkStoreOptions o = options(dir.path(), EvictionPolicy::lru);
  o.disk_budget_bytes = 3 * file;
  ChunkStore s(o);
  auto st = s.stats();
  EXPECT_EQ(st.disk_entries, 3u);
  EXPECT_EQ(st.disk_bytes, 3 * file);
  EXPECT_EQ(st.memory_entries, 0u);
  s.put(synthetic_cache(k3, tiny_hparams()));
  EXPECT_FALSE(fs::exists(s.path_for(k0.id())));  // the oldest file
  EXPECT_TRUE(fs::exists(s.path_for(k1.id())));
  EXPECT_EQ(s.stats().evictions_disk, 1u);
}

// Bigger caches, so a load takes long enough for get and prefetch to overlap.
std::vector<ChunkKey> fill(ChunkStore& s, int first_seed, int n, size_t tokens) {
  std::vector<ChunkKey> keys;
  for (int i = 0; i < n; ++i) {
    keys.push_back(tiny_key(first_seed + i, tokens));
    s.put(synthetic_cache(keys.back(), tiny_hparams()));
  }
  return keys;
}

TEST(StorePrefetch, QueuedRequestFindsItsCachesInMemory) {
  test::TempDir dir;
  ChunkStore s(options(dir.path(), EvictionPolicy::lru));
  const auto keys = fill(s, 100, 5, 300);
  s.clear_memory();
  s.prefetch(keys);
  s.prefetch(keys);  // already queued or loaded: nothing more
  s.wait_prefetches();
  auto st = s.stats();
  EXPECT_EQ(st.prefetches, 5u);
  EXPECT_EQ(st.disk_loads, 5u);
  EXPECT_EQ(st.memory_entries, 5u);
  for (const auto& k : keys) ASSERT_NE(s.get(k), nullptr);
  st = s.stats();
  EXPECT_EQ(st.memory_hits, 5u);
  EXPECT_EQ(st.prefetch_hits, 5u);
  EXPECT_EQ(st.disk_hits, 0u);
  EXPECT_EQ(st.disk_loads, 5u);
  for (const auto& k : keys) ASSERT_NE(s.get(k), nullptr);
  EXPECT_EQ(s.stats().prefetch_hits, 5u);  // counted once per prefetched load

  // Keys without a file, of another model or already in memory are not queued.
  s.prefetch({tiny_key(999, 300), ChunkKey(test::kTinyFingerprint + 1, test::tokens_for(100, 300)), keys[0]});
  s.wait_prefetches();
  EXPECT_EQ(s.stats().prefetches, 5u);
}

TEST(StorePrefetch, ConcurrentGetAndPrefetchLoadEachFileOnce) {
  test::TempDir dir;
  ChunkStore s(options(dir.path(), EvictionPolicy::lru));
  const auto keys = fill(s, 200, 4, 3000);
  for (int round = 0; round < 25; ++round) {
    s.clear_memory();
    const auto loads = s.stats().disk_loads;
    s.prefetch(keys);
    std::vector<std::shared_ptr<const ChunkCache>> a(keys.size()), b(keys.size());
    std::thread other([&] {
      for (size_t i = keys.size(); i-- > 0;) b[i] = s.get(keys[i]);
    });
    for (size_t i = 0; i < keys.size(); ++i) a[i] = s.get(keys[i]);
    other.join();
    s.wait_prefetches();
    ASSERT_EQ(s.stats().disk_loads, loads + keys.size()) << "round " << round;
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_NE(a[i], nullptr);
      EXPECT_EQ(a[i], b[i]);  // one load, one object
    }
  }
  const auto st = s.stats();
  EXPECT_EQ(st.misses, 0u);
  EXPECT_EQ(st.memory_hits + st.disk_hits, 25u * 2 * keys.size());
  EXPECT_LE(st.prefetch_hits, 25u * keys.size());
  EXPECT_LE(st.prefetch_waits, st.prefetch_hits);
}

TEST(StorePrefetch, RemovedWhileQueuedOrLoadingIsNotResurrected) {
  test::TempDir dir;
  ChunkStore s(options(dir.path(), EvictionPolicy::lru));
  const auto keys = fill(s, 300, 6, 3000);
  s.clear_memory();
  s.prefetch(keys);
  for (const auto& k : keys) EXPECT_TRUE(s.remove(k.id()));
  s.wait_prefetches();
  for (const auto& k : keys) EXPECT_EQ(s.get(k), nullptr);
  const auto st = s.stats();
  EXPECT_EQ(st.memory_entries, 0u);
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.disk_entries, 0u);
}

TEST(StorePrefetch, DestructorWithPendingPrefetchesIsClean) {
  test::TempDir dir;
  std::vector<ChunkKey> keys;
  {
    ChunkStore s(options(dir.path(), EvictionPolicy::cachecraft));
    keys = fill(s, 400, 12, 3000);
  }
  for (int round = 0; round < 5; ++round) {
    ChunkStore s(options(dir.path(), EvictionPolicy::cachecraft));
    s.prefetch(keys);
    if (round % 2) {
      ASSERT_NE(s.get(keys.back()), nullptr);  // takes over a queued load
    }
  }  // joins the worker mid-queue
  ChunkStore s(options(dir.path(), EvictionPolicy::cachecraft));
  const VerifyReport r = s.verify();
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.valid, keys.size());
  EXPECT_EQ(r.temp_files, 0u);
  for (const auto& k : keys) EXPECT_NE(s.get(k), nullptr);
}

}  // namespace
}  // namespace cf

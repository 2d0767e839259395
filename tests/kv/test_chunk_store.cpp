#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "kv/chunk_store.h"
#include "kv_test_util.h"

namespace cf {
namespace {

namespace fs = std::filesystem;
using test::max_kv_diff;
using test::synthetic_cache;
using test::tiny_hparams;
using test::tiny_key;

ChunkStoreOptions tiny_options(const std::string& dir, std::vector<std::string>* reports = nullptr,
                               KvDtype dtype = KvDtype::f16) {
  ChunkStoreOptions o;
  o.dir = dir;
  o.disk_dtype = dtype;
  o.model = StoreModel{test::kTinyFingerprint, tiny_hparams()};
  if (reports) o.report = [reports](const std::string& s) { reports->push_back(s); };
  return o;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

TEST(ChunkStore, MemoryThenDiskHit) {
  test::TempDir dir;
  const ChunkKey key = tiny_key(1, 6);
  std::shared_ptr<const ChunkCache> stored;
  {
    ChunkStore s(tiny_options(dir.path()));
    EXPECT_EQ(s.get(key), nullptr);
    stored = s.put(synthetic_cache(key, tiny_hparams()));
    EXPECT_EQ(s.get(key), stored);  // the same object: a memory hit
    const auto st = s.stats();
    EXPECT_EQ(st.misses, 1u);
    EXPECT_EQ(st.memory_hits, 1u);
    EXPECT_EQ(st.disk_writes, 1u);
    EXPECT_TRUE(fs::exists(s.path_for(key.id())));
    EXPECT_EQ(s.path_for(key.id()), dir.path() + "/" + key.id().substr(0, 2) + "/" + key.id() + ".cfkv");
  }
  ChunkStore s2(tiny_options(dir.path()));  // fresh memory tier
  EXPECT_TRUE(s2.contains(key));
  auto r = s2.get(key);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(s2.stats().disk_hits, 1u);
  // put rounded the memory copy to f16, so both tiers serve the same floats.
  EXPECT_EQ(max_kv_diff(r->kv, stored->kv), 0.f);
  EXPECT_EQ(r->extra, stored->extra);
  EXPECT_EQ(s2.get(key), r);  // promoted to memory
  EXPECT_EQ(s2.stats().memory_hits, 1u);
}

TEST(ChunkStore, MemoryTierEvictsLeastRecentlyUsedWithinByteBudget) {
  const ChunkKey k0 = tiny_key(10), k1 = tiny_key(11), k2 = tiny_key(12), k3 = tiny_key(13);
  const size_t one = synthetic_cache(k0, tiny_hparams()).memory_bytes();
  ChunkStoreOptions o = tiny_options("");  // memory only
  o.memory_budget_bytes = 3 * one + one / 2;
  ChunkStore s(o);
  s.put(synthetic_cache(k0, tiny_hparams()));
  s.put(synthetic_cache(k1, tiny_hparams()));
  s.put(synthetic_cache(k2, tiny_hparams()));
  ASSERT_NE(s.get(k0), nullptr);  // k0 becomes most recent; k1 is now the oldest
  s.put(synthetic_cache(k3, tiny_hparams()));
  auto st = s.stats();
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.memory_entries, 3u);
  EXPECT_LE(st.memory_bytes, o.memory_budget_bytes);
  EXPECT_EQ(s.get(k1), nullptr);
  EXPECT_NE(s.get(k0), nullptr);
  EXPECT_NE(s.get(k2), nullptr);
  EXPECT_NE(s.get(k3), nullptr);
  // Order now (most recent first): k3 k2 k0 -> two more puts evict k0 then k2.
  s.put(synthetic_cache(tiny_key(14), tiny_hparams()));
  EXPECT_EQ(s.get(k0), nullptr);
  s.put(synthetic_cache(tiny_key(15), tiny_hparams()));
  EXPECT_EQ(s.get(k2), nullptr);
  EXPECT_NE(s.get(k3), nullptr);
  st = s.stats();
  EXPECT_EQ(st.evictions, 3u);
  EXPECT_LE(st.memory_bytes, o.memory_budget_bytes);
  // A cache larger than the whole budget is returned but not kept.
  const ChunkKey big = tiny_key(16, 40);
  auto c = s.put(synthetic_cache(big, tiny_hparams()));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(s.get(big), nullptr);
  EXPECT_EQ(s.stats().memory_entries, 3u);
}

TEST(ChunkStore, RejectsCachesOfAnotherModel) {
  ChunkStore s(tiny_options(""));
  const ChunkKey foreign(test::kTinyFingerprint + 1, test::tokens_for(1, 4));
  EXPECT_THROW(s.put(synthetic_cache(foreign, tiny_hparams())), std::invalid_argument);
  EXPECT_THROW(s.put(synthetic_cache(tiny_key(1, 4), tiny_hparams(4))), std::invalid_argument);
  ChunkStoreOptions no_model;
  ChunkStore bare(no_model);
  EXPECT_THROW(bare.get(tiny_key(1)), std::logic_error);
}

// --- damage: each defect on a real store file is detected, reported, never served, recomputed.

struct Damage {
  const char* name;
  CacheFileDefect reason;
  // Damages the file of `key` at `path` (store dir `dir`).
  std::function<void(const std::string& path, const ChunkKey& key, const std::string& dir)> apply;
};

void truncate_at(const std::string& path, size_t at) {
  auto b = read_bytes(path);
  ASSERT_LT(at, b.size());
  b.resize(at);
  write_bytes(path, b);
}
void flip(const std::string& path, long offset) {  // negative: from the end
  auto b = read_bytes(path);
  const size_t at = offset >= 0 ? static_cast<size_t>(offset) : b.size() - static_cast<size_t>(-offset);
  b[at] ^= 0x40;
  write_bytes(path, b);
}
void set_u32(const std::string& path, size_t offset, uint32_t v) {
  auto b = read_bytes(path);
  std::memcpy(&b[offset], &v, 4);
  write_bytes(path, b);
}

std::vector<Damage> damages() {
  std::vector<Damage> d;
  for (size_t at : {size_t{0}, size_t{7}, size_t{127}, size_t{128}, size_t{150}})
    d.push_back({"truncate", CacheFileDefect::truncated, [at](auto& p, auto&, auto&) { truncate_at(p, at); }});
  d.push_back({"truncate_half", CacheFileDefect::truncated,
               [](auto& p, auto&, auto&) { truncate_at(p, fs::file_size(p) / 2); }});
  d.push_back({"truncate_last_byte", CacheFileDefect::truncated,
               [](auto& p, auto&, auto&) { truncate_at(p, fs::file_size(p) - 1); }});
  d.push_back({"trailing_bytes", CacheFileDefect::size_mismatch, [](auto& p, auto&, auto&) {
                 auto b = read_bytes(p);
                 b.push_back(0);
                 write_bytes(p, b);
               }});
  d.push_back({"flip_payload", CacheFileDefect::checksum_mismatch, [](auto& p, auto&, auto&) { flip(p, -3); }});
  d.push_back({"flip_token", CacheFileDefect::checksum_mismatch, [](auto& p, auto&, auto&) { flip(p, 130); }});
  d.push_back({"flip_header_tokens", CacheFileDefect::checksum_mismatch, [](auto& p, auto&, auto&) { flip(p, 40); }});
  d.push_back({"flip_header_reserved", CacheFileDefect::checksum_mismatch,
               [](auto& p, auto&, auto&) { flip(p, 100); }});
  d.push_back({"flip_magic", CacheFileDefect::bad_magic, [](auto& p, auto&, auto&) { flip(p, 2); }});
  d.push_back({"version", CacheFileDefect::wrong_version, [](auto& p, auto&, auto&) { set_u32(p, 8, 2); }});
  d.push_back({"foreign_model", CacheFileDefect::foreign_model, [](auto& p, const ChunkKey& key, auto&) {
                 // The same tokens computed by another model, placed under this key's name.
                 const ChunkKey other(key.model_fingerprint() ^ 1, key.tokens());
                 write_cache_file(p, synthetic_cache(other, tiny_hparams()), KvDtype::f16);
               }});
  d.push_back({"wrong_shape", CacheFileDefect::shape_mismatch, [](auto& p, const ChunkKey& key, auto&) {
                 write_cache_file(p, synthetic_cache(key, tiny_hparams(2, 2, 8)), KvDtype::f16);
               }});
  d.push_back({"other_key", CacheFileDefect::key_mismatch, [](auto& p, const ChunkKey& key, auto&) {
                 write_cache_file(p, synthetic_cache(tiny_key(999, key.tokens().size()), tiny_hparams()), KvDtype::f16);
               }});
  return d;
}

class ChunkStoreDamage : public ::testing::TestWithParam<size_t> {};

TEST_P(ChunkStoreDamage, DetectedReportedRecomputedNeverServed) {
  const Damage dmg = damages()[GetParam()];
  SCOPED_TRACE(dmg.name);
  test::TempDir dir;
  const ChunkKey key = tiny_key(42, 9);
  int computes = 0;
  auto compute = [&] {
    ++computes;
    return synthetic_cache(key, tiny_hparams());
  };
  std::shared_ptr<const ChunkCache> original;
  {
    ChunkStore s(tiny_options(dir.path()));
    original = s.get_or_compute(key, compute);
  }
  ASSERT_EQ(computes, 1);
  const ChunkStore probe(tiny_options(dir.path()));
  const std::string path = probe.path_for(key.id());
  dmg.apply(path, key, dir.path());

  // verify() names the defect without changing anything.
  const VerifyReport before = probe.verify();
  ASSERT_EQ(before.bad.size(), 1u);
  EXPECT_EQ(before.bad[0].reason, dmg.reason) << before.bad[0].message;
  EXPECT_NE(before.bad[0].message.find(path), std::string::npos) << before.bad[0].message;
  EXPECT_TRUE(fs::exists(path));

  std::vector<std::string> reports;
  ChunkStore s(tiny_options(dir.path(), &reports));
  auto got = s.get_or_compute(key, compute);
  EXPECT_EQ(computes, 2) << "a damaged file must not be served";
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(max_kv_diff(got->kv, original->kv), 0.f);
  EXPECT_EQ(got->kv.positions(), original->kv.positions());
  const auto st = s.stats();
  EXPECT_EQ(st.corrupt_files, 1u);
  EXPECT_EQ(st.disk_hits, 0u);
  EXPECT_EQ(st.misses, 1u);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].rfind("chunk cache " + path + ": " + defect_name(dmg.reason), 0), 0u) << reports[0];
  EXPECT_NE(reports[0].find(", recomputing"), std::string::npos) << reports[0];
  EXPECT_TRUE(fs::exists(path + ".corrupt"));

  // The recomputed entry was written back and is good; the bad one is aside.
  const VerifyReport after = probe.verify();
  EXPECT_TRUE(after.ok());
  EXPECT_EQ(after.valid, 1u);
  EXPECT_EQ(after.corrupt_aside, 1u);
  ChunkStore fresh(tiny_options(dir.path()));
  auto again = fresh.get(key);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(max_kv_diff(again->kv, original->kv), 0.f);
  EXPECT_EQ(fresh.stats().corrupt_files, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllDefects, ChunkStoreDamage, ::testing::Range(size_t{0}, damages().size()),
                         [](const auto& info) {
                           return std::string(damages()[info.param].name) + "_" + std::to_string(info.param);
                         });

TEST(ChunkStore, ListRemoveVerify) {
  test::TempDir dir;
  ChunkStore s(tiny_options(dir.path()));
  const ChunkKey a = tiny_key(1, 3), b = tiny_key(2, 5, KeyContext::after_prefix(std::vector<TokenId>{1})),
                 c = tiny_key(3, 7);
  for (const ChunkKey* k : {&a, &b, &c}) s.put(synthetic_cache(*k, tiny_hparams()));
  auto ls = s.list();
  ASSERT_EQ(ls.size(), 3u);
  EXPECT_TRUE(std::is_sorted(ls.begin(), ls.end(), [](auto& x, auto& y) { return x.id < y.id; }));
  for (const auto& e : ls) {
    EXPECT_TRUE(e.problem.empty());
    EXPECT_EQ(e.dtype, KvDtype::f16);
    EXPECT_EQ(e.model_fingerprint, test::kTinyFingerprint);
    EXPECT_EQ(e.file_bytes, fs::file_size(e.path));
    EXPECT_EQ(e.offline_ms, 12.5);
    if (e.id == a.id()) {
      EXPECT_EQ(e.n_tokens, 3u);
    }
    if (e.id == b.id()) {
      EXPECT_EQ(e.n_tokens, 5u);
      EXPECT_EQ(e.kind, ContextKind::after_prefix);
    }
  }
  VerifyReport v = s.verify();
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(v.valid, 3u);

  EXPECT_TRUE(s.remove(b.id()));
  EXPECT_FALSE(s.remove(b.id()));
  EXPECT_EQ(s.get(b), nullptr);  // gone from memory and disk
  EXPECT_EQ(s.list().size(), 2u);

  // A damaged file is listed with its problem and fails verify.
  truncate_at(s.path_for(c.id()), 100);
  ls = s.list();
  ASSERT_EQ(ls.size(), 2u);
  const auto bad = std::find_if(ls.begin(), ls.end(), [&](auto& e) { return e.id == c.id(); });
  ASSERT_NE(bad, ls.end());
  EXPECT_EQ(bad->problem, "truncated");
  v = s.verify();
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.valid, 1u);

  // Stray temp files are counted, not treated as entries.
  write_bytes(dir.path() + "/" + a.id().substr(0, 2) + "/." + a.id() + ".cfkv.tmp.1.abc", {1, 2, 3});
  v = s.verify();
  EXPECT_EQ(v.temp_files, 1u);
  EXPECT_EQ(v.checked, 2u);

  EXPECT_EQ(s.remove_all(), 2u);
  EXPECT_TRUE(s.list().empty());
  v = s.verify();
  EXPECT_EQ(v.checked, 0u);
  EXPECT_EQ(v.temp_files, 0u);
  EXPECT_EQ(s.get(a), nullptr);
}

// Two writer processes fill the same store with the same keys (in opposite orders) while a
// third process keeps reading: nobody ever sees a bad file, and every entry ends up valid.
TEST(ChunkStore, TwoProcessesFillTheSameStore) {
  test::TempDir dir;
  constexpr int kKeys = 40;
  std::vector<ChunkKey> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(tiny_key(100 + i, 20 + i % 7));

  auto child = [&](auto body) -> pid_t {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int rc = 0;
      try {
        rc = body();
      } catch (...) {
        rc = 3;
      }
      ::_exit(rc);
    }
    return pid;
  };
  auto writer = [&](bool reverse) {
    return [&, reverse] {
      std::vector<std::string> reports;
      ChunkStore s(tiny_options(dir.path(), &reports));
      for (int round = 0; round < 3; ++round)
        for (int j = 0; j < kKeys; ++j) {
          const ChunkKey& k = keys[reverse ? kKeys - 1 - j : j];
          s.put(synthetic_cache(k, tiny_hparams()));
        }
      return reports.empty() ? 0 : 1;
    };
  };
  const pid_t w1 = child(writer(false)), w2 = child(writer(true));
  const pid_t reader = child([&] {
    std::vector<std::string> reports;
    ChunkStoreOptions o = tiny_options(dir.path(), &reports);
    o.memory_budget_bytes = 0;  // always read from disk
    ChunkStore s(o);
    int hits = 0;
    for (int round = 0; round < 200 && hits < 5 * kKeys; ++round)
      for (const ChunkKey& k : keys)
        if (auto c = s.get(k)) {
          ++hits;
          if (max_kv_diff(c->kv, synthetic_cache(k, tiny_hparams()).kv) > 1e-2f) return 4;
        }
    return reports.empty() && s.stats().corrupt_files == 0 ? 0 : 5;
  });
  for (pid_t pid : {w1, w2, reader}) {
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child " << pid;
  }
  ChunkStore s(tiny_options(dir.path()));
  const VerifyReport v = s.verify();
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(v.valid, static_cast<size_t>(kKeys));
  EXPECT_EQ(v.temp_files, 0u);
  EXPECT_EQ(v.corrupt_aside, 0u);
  for (const ChunkKey& k : keys) EXPECT_NE(s.get(k), nullptr);
}

TEST(ChunkStore, ConcurrentThreadsShareOneStore) {
  test::TempDir dir;
  ChunkStoreOptions o = tiny_options(dir.path());
  const size_t one = synthetic_cache(tiny_key(0, 8), tiny_hparams()).memory_bytes();
  o.memory_budget_bytes = 5 * one;
  o.durable = false;  // the no-fsync path: still atomic for readers
  ChunkStore s(o);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 60; ++i) {
        const ChunkKey k = tiny_key((i * 7 + t) % 12, 8);
        auto c = s.get_or_compute(k, [&] { return synthetic_cache(k, tiny_hparams()); });
        if (!c || c->key.id() != k.id()) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  const auto st = s.stats();
  EXPECT_LE(st.memory_bytes, o.memory_budget_bytes);
  EXPECT_EQ(st.memory_hits + st.disk_hits + st.misses, 240u);
  EXPECT_EQ(st.misses, st.computes);
  EXPECT_GE(st.computes, 12u);
  EXPECT_EQ(st.corrupt_files, 0u);
  EXPECT_TRUE(s.verify().ok());
  EXPECT_EQ(s.list().size(), 12u);
}

// Issue 59: the web page polls GET /v1/knowledge/chunks (every 700 ms while a document is
// precomputing), and each chunk's cache state opened its file for the header when the memory
// tier did not hold it: every listing read every file. The header's metadata is remembered
// per file (checked against the file's size and change time, one lstat), so a listing reads
// each file once, and again only after it changed.
TEST(ChunkStore, ListingCacheStatesOpensEachFileOnceUntilItChanges) {
  test::TempDir dir;
  ChunkStoreOptions o = tiny_options(dir.path());
  o.memory_budget_bytes = 0;  // nothing in memory: every state comes from the disk tier
  ChunkStore s(o);
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 10; ++i) {
    keys.push_back(tiny_key(700 + i, 6));
    s.put(synthetic_cache(keys.back(), tiny_hparams()));
  }
  for (int listing = 0; listing < 5; ++listing)
    for (const auto& k : keys) {
      const ChunkTiers t = s.tiers(k.id());
      EXPECT_TRUE(t.disk);
      EXPECT_FALSE(t.memory);
    }
  EXPECT_LE(s.stats().disk_header_reads, keys.size()) << "5 listings of 10 files";
  const uint64_t before = s.stats().disk_header_reads;
  // A file rewritten with other metadata is read again, and its new metadata is what is shown.
  ChunkCache changed = synthetic_cache(keys[0], tiny_hparams());
  changed.extra = {{"probe", 1}};
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s.put(std::move(changed));
  EXPECT_EQ(s.tiers(keys[0].id()).extra.value("probe", 0), 1);
  EXPECT_EQ(s.stats().disk_header_reads, before + 1);
  // A file deleted behind the store's back is not on disk any more.
  fs::remove(s.path_for(keys[1].id()));
  EXPECT_FALSE(s.tiers(keys[1].id()).disk);
}

}  // namespace
}  // namespace cf

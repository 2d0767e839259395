// The chunk store's remote tier against a real redis-server on loopback (issue 13).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <chrono>
#include <mutex>
#include <filesystem>
#include <set>
#include <thread>
#include <atomic>

#include "kv/cache_file.h"
#include "kv/chunk_store.h"
#include "kv/remote_tier.h"
#include "kv_test_util.h"
#include "redis_fixture.h"

namespace cf {
namespace {

namespace fs = std::filesystem;
using test::max_kv_diff;
using test::RedisServer;
using test::synthetic_cache;
using test::tiny_hparams;
using test::tiny_key;

// The store key of every store and tier in these tests (a remote tier needs one).
std::shared_ptr<const EntryAuth> test_key() {
  return std::make_shared<const EntryAuth>(std::vector<uint8_t>(32, 0x5a));
}

RemoteTierOptions remote_options(const RedisServer& r) {
  RemoteTierOptions o;
  o.url = r.url();
  o.auth = test_key();
  o.piece_bytes = 700;  // several pieces per entry, so the piece logic is exercised
  o.retry_ms = 200;
  o.command_timeout_ms = 500;
  return o;
}

// Report lines, from the test thread and the remote tier's writer thread alike.
class Reports {
 public:
  void add(const std::string& line) {
    std::lock_guard lock(mu_);
    lines_.push_back(line);
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    return lines_.size();
  }
  bool empty() const { return size() == 0; }
  bool any_contains(const std::string& text) const {
    std::lock_guard lock(mu_);
    for (const auto& l : lines_)
      if (l.find(text) != std::string::npos) return true;
    return false;
  }
  std::string all() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& l : lines_) out += l + "\n";
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

ChunkStoreOptions store_options(const RedisServer& r, const std::string& dir, Reports* reports = nullptr) {
  ChunkStoreOptions o;
  o.dir = dir;
  o.durable = false;
  o.model = StoreModel{test::kTinyFingerprint, tiny_hparams()};
  o.auth = test_key();  // a remote tier needs a key
  o.remote = remote_options(r);
  if (reports) o.report = [reports](const std::string& s) { reports->add(s); };
  return o;
}

ChunkCache tiny_cache(const ChunkKey& k) { return synthetic_cache(k, tiny_hparams()); }

// Whoever can write to Redis must not be able to have entries served (issue 17, item 6): a
// store with a remote tier and no key is refused at construction, with the option to set.
TEST(RemoteTier, StoreRefusesARemoteTierWithoutAKey) {
  test::TempDir dir;
  ChunkStoreOptions o;
  o.dir = dir.path();
  o.model = StoreModel{test::kTinyFingerprint, tiny_hparams()};
  o.remote = RemoteTierOptions{};
  o.remote->url = "redis://127.0.0.1:1";
  try {
    ChunkStore store(o);
    FAIL() << "a remote tier without a store key was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--store-key-file"), std::string::npos) << e.what();
  }
}

// Puts `keys` through a store of its own (like replica A) and waits until they are in Redis.
void fill_remote(const RedisServer& r, const std::vector<ChunkKey>& keys) {
  test::TempDir dir;
  ChunkStore a(store_options(r, dir.path()));
  for (const auto& k : keys) a.put(tiny_cache(k));
  ASSERT_TRUE(a.flush_remote(10000));
  EXPECT_EQ(a.stats().remote.writes, keys.size());
}

TEST(RedisUrl, Parses) {
  const RedisUrl u = parse_redis_url("redis://10.0.0.7:7000/3");
  EXPECT_EQ(u.host, "10.0.0.7");
  EXPECT_EQ(u.port, 7000);
  EXPECT_EQ(u.db, 3);
  const RedisUrl d = parse_redis_url("redis://cache");
  EXPECT_EQ(d.host, "cache");
  EXPECT_EQ(d.port, 6379);
  EXPECT_EQ(d.db, 0);
  for (const char* bad : {"", "http://x:1", "redis://", "redis://h:0", "redis://h:99999", "redis://h:12x",
                          "redis://h:1/x", "redis://u:p@h:1"})
    EXPECT_THROW(parse_redis_url(bad), std::invalid_argument) << bad;
}

TEST(RemoteManifest, ParsesAndBoundsWhatReadersWillAllocate) {
  const std::string tag(64, 'a');
  const auto m = parse_remote_manifest(R"({"format":2,"raw":100,"zlen":20,"sum":"0123456789abcdef","pieces":1,"tag":")" +
                                       tag + "\"}");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->raw, 100u);
  EXPECT_EQ(m->pieces, 1u);
  EXPECT_EQ(m->tag, tag);
  for (const char* bad : {"", "{", "[]", R"({"format":3,"raw":1,"zlen":1,"sum":"0123456789abcdef","pieces":1})",
                          R"({"format":2,"raw":1,"zlen":1,"sum":"0123456789abcdef","pieces":1})",  // no tag
                          R"({"format":2,"raw":1,"zlen":1,"sum":"0123456789abcdef","pieces":1,"tag":"xy"})",
                          R"({"format":1,"raw":1,"zlen":1,"sum":"XYZ","pieces":1})",
                          R"({"format":1,"raw":1,"zlen":1,"sum":"0123456789abcdef","pieces":0})",
                          R"({"format":1,"raw":1e30,"zlen":1,"sum":"0123456789abcdef","pieces":1})",
                          R"({"format":1,"raw":-1,"zlen":1,"sum":"0123456789abcdef","pieces":1})"})
    EXPECT_FALSE(parse_remote_manifest(bad).has_value()) << bad;
  // Format 1 parses (so that its pieces can be deleted) but no reader fetches it.
  const auto old = parse_remote_manifest(R"({"format":1,"raw":100,"zlen":20,"sum":"0123456789abcdef","pieces":1})");
  ASSERT_TRUE(old.has_value());
  std::string why;
  EXPECT_FALSE(remote_manifest_within(*old, size_t{1} << 30, why));
  EXPECT_NE(why.find("format 1"), std::string::npos) << why;

  // A manifest whose size disagrees with the zstd frame is refused before any allocation.
  const std::vector<uint8_t> image = encode_cache_file(tiny_cache(tiny_key(1, 40)), KvDtype::f16);
  RedisServer redis;
  {
    RemoteTier t(remote_options(redis));
    ASSERT_TRUE(t.put_async("x", image));
    ASSERT_TRUE(t.flush(10000));
  }
  auto stored = parse_remote_manifest(redis.text({"GET", "chunkfuse:v2:{x}"}));
  ASSERT_TRUE(stored.has_value());
  std::vector<uint8_t> z;
  for (size_t i = 0; i < stored->pieces; ++i) {
    const std::string piece = redis.text({"GET", "chunkfuse:v2:{x}:" + stored->sum + ":" + std::to_string(i)});
    z.insert(z.end(), piece.begin(), piece.end());
  }
  const auto key = test_key();
  auto out = unpack_remote_entry(*stored, z, size_t{1} << 30, *key, "x", why);
  ASSERT_TRUE(out.has_value()) << why;
  EXPECT_EQ(*out, image);
  RemoteManifest lying = *stored;
  lying.raw = size_t{1} << 35;
  EXPECT_FALSE(unpack_remote_entry(lying, z, size_t{1} << 36, *key, "x", why).has_value());
  EXPECT_NE(why.find("tag"), std::string::npos) << why;  // raw is under the tag
  lying.tag = remote_entry_tag(*key, "x", lying.raw, z.data(), z.size());  // signed, yet lying about its size
  EXPECT_FALSE(unpack_remote_entry(lying, z, size_t{1} << 36, *key, "x", why).has_value());
  EXPECT_NE(why.find("zstd frame"), std::string::npos) << why;
  EXPECT_FALSE(unpack_remote_entry(*stored, z, 100, *key, "x", why).has_value());  // over the bound
  EXPECT_NE(why.find("entry limit"), std::string::npos) << why;
  EXPECT_FALSE(unpack_remote_entry(*stored, z, size_t{1} << 30, *key, "y", why).has_value());  // another id's
  const EntryAuth other(std::vector<uint8_t>(32, 0x33));
  EXPECT_FALSE(unpack_remote_entry(*stored, z, size_t{1} << 30, other, "x", why).has_value());
  EXPECT_NE(why.find("tag does not match"), std::string::npos) << why;
}

TEST(RemoteTier, ASecondStoreReadsWhatTheFirstWrote) {
  RedisServer redis;
  const std::vector<ChunkKey> keys{tiny_key(1, 40), tiny_key(2, 7), tiny_key(3, 90)};
  fill_remote(redis, keys);
  test::TempDir dir_b;
  Reports reports;
  ChunkStore b(store_options(redis, dir_b.path(), &reports));
  for (const auto& k : keys) {
    auto c = b.get(k);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(max_kv_diff(c->kv, tiny_cache(k).kv), 0.f);
    EXPECT_EQ(c->extra, tiny_cache(k).extra);
    EXPECT_TRUE(fs::exists(b.path_for(k.id())));  // kept on B's disk tier too
  }
  auto st = b.stats();
  EXPECT_EQ(st.remote_hits, keys.size());
  EXPECT_EQ(st.remote.hits, keys.size());
  EXPECT_EQ(st.computes, 0u);
  EXPECT_GT(st.remote.bytes_read, 0u);
  EXPECT_EQ(st.remote.reads, keys.size());
  EXPECT_EQ(st.remote.read_ms_buckets.back(), keys.size());
  EXPECT_TRUE(reports.empty());
  // Entries are pieces plus a manifest, committed together.
  EXPECT_EQ(redis.keys("chunkfuse:v2:{" + keys[2].id() + "}").size(), 1u);
  EXPECT_GT(redis.keys("chunkfuse:v2:{" + keys[2].id() + "}:*").size(), 1u);
  // A second writer of the same bytes writes nothing.
  b.put(tiny_cache(keys[0]));
  ASSERT_TRUE(b.flush_remote(10000));
  EXPECT_EQ(b.stats().remote.writes_present, 1u);
  // A miss is a miss.
  EXPECT_EQ(b.get(tiny_key(99, 5)), nullptr);
  EXPECT_EQ(b.stats().remote.misses, 1u);
}

TEST(RemoteTier, PrefetchLoadsRemoteEntries) {
  RedisServer redis;
  const std::vector<ChunkKey> keys{tiny_key(11, 30), tiny_key(12, 30)};
  fill_remote(redis, keys);
  test::TempDir dir;
  ChunkStore b(store_options(redis, dir.path()));
  b.prefetch(keys);
  b.wait_prefetches();
  for (const auto& k : keys) EXPECT_NE(b.get(k), nullptr);
  EXPECT_EQ(b.stats().memory_hits, keys.size());
  EXPECT_EQ(b.stats().remote.hits, keys.size());
}

// Damage done to an entry in Redis; each must be detected, reported, deleted, recomputed.
struct Damage {
  const char* name;
  std::function<void(RedisServer&, const ChunkKey&)> apply;
  bool counted_corrupt;  // false: a plain miss (incomplete entry)
};

void overwrite_entry(RedisServer& redis, const ChunkKey& k, const std::vector<uint8_t>& image,
                     std::shared_ptr<const EntryAuth> key = test_key()) {
  RemoteTierOptions o = remote_options(redis);
  o.auth = std::move(key);
  RemoteTier t(o);  // model-agnostic: stores whatever image it is given under k's name
  ASSERT_TRUE(t.put_async(k.id(), image));
  ASSERT_TRUE(t.flush(10000));
}

std::vector<Damage> damages() {
  return {
      {"piece_bytes_flipped_in_place",
       [](RedisServer& r, const ChunkKey& k) {
         auto pieces = r.keys("chunkfuse:v2:{" + k.id() + "}:*");
         ASSERT_FALSE(pieces.empty());
         EXPECT_NE(r.text({"SETRANGE", pieces[0], "10", "garbage!"}), "");
       },
       true},
      {"manifest_not_json",
       [](RedisServer& r, const ChunkKey& k) { r.text({"SET", "chunkfuse:v2:{" + k.id() + "}", "{nope"}); }, true},
      {"piece_evicted",
       [](RedisServer& r, const ChunkKey& k) {
         auto pieces = r.keys("chunkfuse:v2:{" + k.id() + "}:*");
         ASSERT_FALSE(pieces.empty());
         r.text({"DEL", pieces.back()});
       },
       false},
      {"made_by_another_model",
       [](RedisServer& r, const ChunkKey& k) {
         const ChunkKey foreign(0x9999, k.tokens(), k.context());
         overwrite_entry(r, k, encode_cache_file(synthetic_cache(foreign, tiny_hparams()), KvDtype::f16));
       },
       true},
      {"another_model_shape",
       [](RedisServer& r, const ChunkKey& k) {
         overwrite_entry(r, k, encode_cache_file(synthetic_cache(k, tiny_hparams(2, 2, 8)), KvDtype::f16));
       },
       true},
      {"another_key",
       [](RedisServer& r, const ChunkKey& k) {
         overwrite_entry(r, k, encode_cache_file(tiny_cache(tiny_key(777, 40)), KvDtype::f16));
       },
       true},
      {"not_a_cache_file",
       [](RedisServer& r, const ChunkKey& k) { overwrite_entry(r, k, std::vector<uint8_t>(5000, 0x42)); }, true},
  };
}

class RemoteDamage : public ::testing::TestWithParam<size_t> {};

TEST_P(RemoteDamage, NeverServedReportedDeletedRecomputed) {
  const Damage d = damages()[GetParam()];
  RedisServer redis;
  const ChunkKey k = tiny_key(5, 40);
  fill_remote(redis, {k});
  d.apply(redis, k);
  test::TempDir dir;
  Reports reports;
  ChunkStore b(store_options(redis, dir.path(), &reports));
  int computes = 0;
  auto c = b.get_or_compute(k, [&] {
    ++computes;
    return tiny_cache(k);
  });
  EXPECT_EQ(computes, 1) << d.name;
  EXPECT_EQ(max_kv_diff(c->kv, tiny_cache(k).kv), 0.f);
  auto st = b.stats();
  EXPECT_EQ(st.remote_hits, 0u);
  EXPECT_EQ(st.remote.corrupt, d.counted_corrupt ? 1u : 0u) << d.name;
  EXPECT_EQ(st.remote.incomplete, d.counted_corrupt ? 0u : 1u) << d.name;
  EXPECT_EQ(reports.size(), d.counted_corrupt ? 1u : 0u) << d.name;
  // The bad entry was deleted and the recomputed one written in its place: a fresh store
  // (another replica) now reads the good one.
  ASSERT_TRUE(b.flush_remote(10000));
  test::TempDir dir_c;
  ChunkStore c2(store_options(redis, dir_c.path()));
  auto again = c2.get(k);
  ASSERT_NE(again, nullptr) << d.name;
  EXPECT_EQ(max_kv_diff(again->kv, tiny_cache(k).kv), 0.f);
  EXPECT_EQ(c2.stats().remote.corrupt, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllDamages, RemoteDamage, ::testing::Range(size_t{0}, damages().size()),
                         [](const auto& info) { return std::string(damages()[info.param].name); });

TEST(RemoteTier, FlushAllIsAMissThenRefilled) {
  RedisServer redis;
  const ChunkKey k = tiny_key(6, 20);
  fill_remote(redis, {k});
  EXPECT_EQ(redis.text({"FLUSHALL"}), "OK");
  test::TempDir dir;
  ChunkStore b(store_options(redis, dir.path()));
  EXPECT_EQ(b.get(k), nullptr);
  b.put(tiny_cache(k));
  ASSERT_TRUE(b.flush_remote(10000));
  test::TempDir dir_c;
  ChunkStore c(store_options(redis, dir_c.path()));
  EXPECT_NE(c.get(k), nullptr);
}

TEST(RemoteTier, RedisDownMeansLocalTiersThenReconnects) {
  auto redis = std::make_unique<RedisServer>();
  const int port = redis->port();
  const ChunkKey k1 = tiny_key(7, 20), k2 = tiny_key(8, 20);
  fill_remote(*redis, {k1});
  test::TempDir dir;
  Reports reports;
  ChunkStore b(store_options(*redis, dir.path(), &reports));
  ASSERT_NE(b.get(k1), nullptr);  // connected, remote hit
  redis->stop();
  // Local tiers keep serving; remote reads are misses and writes are dropped, nothing throws.
  EXPECT_NE(b.get(k1), nullptr);
  EXPECT_EQ(b.get(k2), nullptr);
  b.put(tiny_cache(k2));
  b.flush_remote(5000);
  auto st = b.stats();
  EXPECT_GE(st.remote.errors, 1u);
  EXPECT_FALSE(st.remote.up);
  EXPECT_FALSE(reports.empty());  // the outage is reported once
  const size_t outage_reports = reports.size();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(b.get(tiny_key(200 + i, 5)), nullptr);
  EXPECT_LE(reports.size(), outage_reports + 2);  // not one line per request
  // Back on the same port (empty): the store reconnects by itself after retry_ms.
  redis = std::make_unique<RedisServer>(std::vector<std::string>{}, port);
  bool written = false;
  for (int i = 0; i < 100 && !written; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    b.remove(k2.id());  // so that put writes it again
    b.put(tiny_cache(k2));
    b.flush_remote(5000);
    written = !redis->keys("chunkfuse:v2:{" + k2.id() + "}").empty();
  }
  EXPECT_TRUE(written);
  EXPECT_TRUE(b.stats().remote.up);
  EXPECT_GE(b.stats().remote.connects, 2u);
}

TEST(RemoteTier, AStalledRedisCostsAtMostTheCommandTimeout) {
  RedisServer redis;
  const ChunkKey k = tiny_key(9, 20);
  test::TempDir dir;
  ChunkStoreOptions o = store_options(redis, dir.path());
  o.remote->command_timeout_ms = 200;
  ChunkStore b(o);
  EXPECT_EQ(b.get(k), nullptr);  // connected
  redis.pause();
  const uint64_t errors_before = b.stats().remote.errors;
  // Redis is stopped (SIGSTOP) until resume() below: had a get waited for its reply instead of
  // timing out, it would never return and ctest's timeout would fail the test. No wall-clock
  // bound here (issue 24: it flaked on a loaded machine); the invariant is that both gets
  // return a miss and the stall was counted as a failed command (the second get may skip
  // Redis while the tier is marked down).
  EXPECT_EQ(b.get(k), nullptr);
  EXPECT_EQ(b.get(tiny_key(10, 20)), nullptr);  // a new connection: accepted by the kernel, then times out too
  const auto st = b.stats().remote;
  redis.resume();
  EXPECT_GE(st.errors, errors_before + 1) << "the stall is a counted failure, not a hang";
  EXPECT_FALSE(st.up);
}

TEST(RemoteTier, FullRedisRefusesWritesAndNothingBadIsServed) {
  // noeviction: writes fail with OOM, which must cost nothing but the write. Filled first,
  // then capped below what it holds, so that every write is refused.
  RedisServer redis({"--maxmemory-policy", "noeviction"});
  const std::string filler(64 * 1024, 'x');
  for (int i = 0; i < 48; ++i) redis.text({"SET", "filler:" + std::to_string(i), filler});
  ASSERT_EQ(redis.text({"CONFIG", "SET", "maxmemory", "2mb"}), "OK");
  ASSERT_EQ(redis.text({"SET", "probe", "x"}).rfind("OOM", 0), 0u);
  test::TempDir dir;
  Reports reports;
  ChunkStore a(store_options(redis, dir.path(), &reports));
  const ChunkKey k = tiny_key(12, 200);
  a.put(tiny_cache(k));
  ASSERT_TRUE(a.flush_remote(10000));
  EXPECT_EQ(a.stats().remote.write_errors, 1u);
  EXPECT_EQ(a.stats().remote.writes, 0u);
  EXPECT_TRUE(redis.keys("chunkfuse:*").empty());  // the refused transaction left nothing
  EXPECT_NE(a.get(k), nullptr);                     // the local tiers have it
}

TEST(RemoteTier, EvictingRedisServesWholeEntriesOrMisses) {
  // allkeys-lru evicts pieces one by one: readers must see whole entries or misses.
  RedisServer redis({"--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"});
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 40; ++i) keys.push_back(tiny_key(300 + i, 400));  // ~19 KB each before zstd
  {
    test::TempDir dir;
    ChunkStoreOptions o = store_options(redis, dir.path());
    o.remote->piece_bytes = 4096;
    ChunkStore a(o);
    for (const auto& k : keys) a.put(tiny_cache(k));
    ASSERT_TRUE(a.flush_remote(20000));
  }
  test::TempDir dir;
  ChunkStore b(store_options(redis, dir.path()));
  size_t hits = 0;
  for (const auto& k : keys)
    if (auto c = b.get(k)) {
      ++hits;
      EXPECT_EQ(max_kv_diff(c->kv, tiny_cache(k).kv), 0.f);
    }
  const auto st = b.stats();
  EXPECT_EQ(st.remote.corrupt, 0u);
  EXPECT_EQ(st.remote.hits, hits);
  EXPECT_EQ(st.remote.hits + st.remote.misses, keys.size());
}

TEST(RemoteTier, AWriterKilledMidWayLeavesNoPartialEntry) {
  RedisServer redis;
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 200; ++i) keys.push_back(tiny_key(500 + i, 300));
  const pid_t child = ::fork();
  if (child == 0) {  // the writer: a whole store whose remote writer is busy when killed
    try {
      test::TempDir dir;
      ChunkStoreOptions o = store_options(redis, dir.path());
      o.remote->piece_bytes = 512;  // many pieces: the kill lands inside transactions
      o.remote->queue_entries = 1000;
      ChunkStore a(o);
      for (const auto& k : keys) a.put(tiny_cache(k));
      a.flush_remote(60000);
    } catch (...) {
    }
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  // Kill once some entries are committed, mid-stream.
  for (int i = 0; i < 400 && redis.keys("chunkfuse:v2:{*}").size() < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const size_t committed = redis.keys("chunkfuse:v2:{*}").size();
  EXPECT_GT(committed, 0u);
  EXPECT_LT(committed, keys.size());  // killed mid-way, not after the last write
  test::TempDir dir;
  Reports reports;
  ChunkStore b(store_options(redis, dir.path(), &reports));
  size_t hits = 0;
  for (const auto& k : keys)
    if (auto c = b.get(k)) {
      ++hits;
      EXPECT_EQ(max_kv_diff(c->kv, tiny_cache(k).kv), 0.f);
    }
  const auto st = b.stats();
  EXPECT_EQ(hits, committed);
  EXPECT_EQ(st.remote.corrupt, 0u);
  EXPECT_EQ(st.remote.incomplete, 0u);
  EXPECT_TRUE(reports.empty());
}

// Issue 29 item 9: a manifest may claim up to 64 GiB, and the reader used to reserve that
// before any check: std::bad_alloc on the prefetch thread ended the process. Now the entry
// limit is checked on the manifest, before any piece is fetched or any buffer sized, and an
// entry of the format before issue 29 is refused by name.
TEST(RemoteTier, AManifestOverTheEntryLimitIsRefusedBeforeAnythingIsFetched) {
  RedisServer redis;
  const ChunkKey k1 = tiny_key(40, 30), k2 = tiny_key(41, 30);
  fill_remote(redis, {k1, k2});
  const std::string huge = std::to_string(size_t{1} << 36);  // 64 GiB, the old parser's bound
  auto forge = [&](const ChunkKey& k, int format) {
    const std::string key = "chunkfuse:v2:{" + k.id() + "}";
    const auto m = parse_remote_manifest(redis.text({"GET", key}));
    ASSERT_TRUE(m.has_value());
    std::string j = R"({"format":)" + std::to_string(format) + R"(,"raw":)" + huge + R"(,"zlen":)" + huge +
                    R"(,"sum":")" + m->sum + R"(","pieces":)" + std::to_string(m->pieces);
    if (format == 2) j += R"(,"tag":")" + m->tag + "\"";
    ASSERT_EQ(redis.text({"SET", key, j + "}"}), "OK");
  };
  forge(k1, 1);
  forge(k2, 2);
  test::TempDir dir;
  Reports reports;
  ChunkStore b(store_options(redis, dir.path(), &reports));
  b.prefetch({k1, k2});  // on the prefetch thread, where an escaping exception ends the process
  b.wait_prefetches();
  EXPECT_TRUE(reports.any_contains("manifest format 1")) << reports.all();
  EXPECT_TRUE(reports.any_contains("over the entry limit")) << reports.all();
  const auto st = b.stats();
  EXPECT_EQ(st.remote.corrupt, 2u);
  EXPECT_EQ(st.remote.bytes_read, 0u);  // no piece was fetched
  EXPECT_TRUE(redis.keys("chunkfuse:v2:{" + k1.id() + "}*").empty());  // deleted, pieces too
  EXPECT_TRUE(redis.keys("chunkfuse:v2:{" + k2.id() + "}*").empty());
  int computes = 0;
  for (const auto& k : {k1, k2})
    b.get_or_compute(k, [&] {
      ++computes;
      return tiny_cache(k);
    });
  EXPECT_EQ(computes, 2);
}

// Issue 29 item 9: a zstd bomb (a few KB that inflate to 64 MiB) written by whoever can reach
// Redis without the key used to be decompressed before any tag was checked. The manifest's
// tag over the compressed bytes is checked first: it is refused without being inflated.
TEST(RemoteTier, AnEntryWithoutTheKeysTagIsNeverDecompressed) {
  RedisServer redis;
  const ChunkKey k = tiny_key(42, 30);
  const auto intruder = std::make_shared<const EntryAuth>(std::vector<uint8_t>(32, 0x77));
  overwrite_entry(redis, k, std::vector<uint8_t>(size_t{64} << 20, 0), intruder);
  const auto m = parse_remote_manifest(redis.text({"GET", "chunkfuse:v2:{" + k.id() + "}"}));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->raw, size_t{64} << 20);
  EXPECT_LT(m->zlen, size_t{64} << 10);  // the bomb: under 64 KB on the wire
  test::TempDir dir;
  Reports reports;
  ChunkStore b(store_options(redis, dir.path(), &reports));
  EXPECT_EQ(b.get(k), nullptr);
  EXPECT_TRUE(reports.any_contains("manifest tag does not match")) << reports.all();
  EXPECT_FALSE(reports.any_contains("magic")) << reports.all();  // the image was never looked at
  EXPECT_EQ(b.stats().remote.corrupt, 1u);
  EXPECT_TRUE(redis.keys("chunkfuse:v2:{" + k.id() + "}*").empty());
}

// The order itself (issue 29 item 9): a bomb whose tag is wrong and whose zstd frame is also
// damaged past its header. Checked in the right order it is refused on the tag; a reader that
// decompressed first would inflate 64 MiB and then report the frame, so this fails then.
TEST(RemoteTier, TheTagIsCheckedBeforeAnyByteIsDecompressed) {
  const std::vector<uint8_t> raw(size_t{64} << 20, 0);
  std::vector<uint8_t> z(ZSTD_compressBound(raw.size()));
  z.resize(ZSTD_compress(z.data(), z.size(), raw.data(), raw.size(), 1));
  ASSERT_GT(z.size(), 16u);
  for (size_t i = z.size() - 8; i < z.size(); ++i) z[i] ^= 0xA5;  // the last block, not the header
  const EntryAuth right(std::vector<uint8_t>(32, 0x11)), intruder(std::vector<uint8_t>(32, 0x77));
  const std::string id(32, 'a');
  RemoteManifest m;
  m.raw = raw.size();
  m.zlen = z.size();
  m.pieces = 1;
  char sum[17];
  std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(XXH3_64bits(z.data(), z.size())));
  m.sum = sum;
  m.tag = remote_entry_tag(intruder, id, m.raw, z.data(), z.size());
  std::string why;
  EXPECT_FALSE(unpack_remote_entry(m, z, raw.size(), right, id, why).has_value());
  EXPECT_NE(why.find("manifest tag does not match"), std::string::npos) << why;
  // With the right key's tag the same bytes reach zstd, which finds the damage.
  m.tag = remote_entry_tag(right, id, m.raw, z.data(), z.size());
  why.clear();
  EXPECT_FALSE(unpack_remote_entry(m, z, raw.size(), right, id, why).has_value());
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(why.find("manifest tag"), std::string::npos) << why;
}

// Issue 29 item 11: the folder a remote hit is written to is created private (0700) and a
// symlink planted in its place is never written through (as put already did).
TEST(RemoteTier, ARemoteHitIsKeptInAPrivateRealFolder) {
  RedisServer redis;
  const ChunkKey k1 = tiny_key(43, 30), k2 = tiny_key(44, 30);
  ASSERT_NE(k1.id().substr(0, 2), k2.id().substr(0, 2));
  fill_remote(redis, {k1, k2});
  test::TempDir root;
  const std::string store = root.path() + "/store", outside = root.path() + "/outside";
  fs::create_directories(store);
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, store + "/" + k2.id().substr(0, 2));
  const mode_t old = ::umask(022);
  Reports reports;
  {
    ChunkStore b(store_options(redis, store, &reports));
    EXPECT_NE(b.get(k1), nullptr);
    EXPECT_NE(b.get(k2), nullptr);  // served from memory; not kept on disk
  }
  ::umask(old);
  struct stat st {};
  ASSERT_EQ(::stat((store + "/" + k1.id().substr(0, 2)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_TRUE(fs::is_empty(outside));
  EXPECT_TRUE(reports.any_contains("kept in memory only")) << reports.all();
}

// Issue 59: two replicas writing one id (each its own bytes: the image carries its write
// time) used to race. Each read the manifest, then in MULTI wrote its pieces and manifest and
// deleted the pieces of the manifest it had read; whichever committed first had its pieces
// orphaned (named by no manifest, never deleted, no TTL). A deleter likewise. The hook
// interleaves them exactly: B writes the id between A's read of the manifest and A's EXEC.
std::vector<std::string> orphan_pieces(RedisServer& redis, const RemoteTier& t, const std::string& id) {
  const std::string manifest = redis.text({"GET", t.manifest_key(id)});
  std::set<std::string> named;
  if (auto m = parse_remote_manifest(manifest))
    for (size_t i = 0; i < m->pieces; ++i) named.insert(t.piece_key(id, m->sum, i));
  std::vector<std::string> orphans;
  for (const auto& k : redis.keys(t.manifest_key(id) + ":*"))
    if (!named.count(k)) orphans.push_back(k);
  return orphans;
}

std::vector<uint8_t> image_of(uint8_t seed, size_t n = 3000) {
  std::vector<uint8_t> img(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& b : img) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return img;
}

TEST(RemoteTier, TwoWritersOfOneIdLeaveNoOrphanPieces) {
  RedisServer redis;
  const std::string id = "0123456789abcdef0123456789abcdef";
  RemoteTier b(remote_options(redis));
  RemoteTierOptions oa = remote_options(redis);
  std::atomic<int> interleaved{0};
  oa.before_commit = [&](const std::string&) {
    if (interleaved++ == 1) {  // A's second write: B commits its own bytes of the id first
      b.put_async(id, image_of(2));
      b.flush(10000);
    }
  };
  RemoteTier a(oa);
  ASSERT_TRUE(a.put_async(id, image_of(1)));  // the entry both replicas then replace
  ASSERT_TRUE(a.flush(10000));
  ASSERT_TRUE(a.put_async(id, image_of(3)));
  ASSERT_TRUE(a.flush(10000));
  EXPECT_EQ(interleaved.load(), 3) << "A's transaction was overtaken once and read again";
  EXPECT_EQ(orphan_pieces(redis, a, id), std::vector<std::string>{});
  EXPECT_EQ(a.get(id), image_of(3));  // A committed last, over B's entry
  EXPECT_EQ(a.stats().commit_retries, 1u);
  EXPECT_EQ(a.stats().write_errors, 0u);

  // A delete overtaken the same way: B writes between the deleter's read and its EXEC.
  std::atomic<bool> once{false};
  RemoteTierOptions od = remote_options(redis);
  od.before_commit = [&](const std::string&) {
    if (!once.exchange(true)) {
      b.put_async(id, image_of(4));
      b.flush(10000);
    }
  };
  RemoteTier d(od);
  d.remove_async(id);
  ASSERT_TRUE(d.flush(10000));
  EXPECT_EQ(orphan_pieces(redis, d, id), std::vector<std::string>{});
  EXPECT_EQ(redis.keys(d.manifest_key(id) + "*"), std::vector<std::string>{}) << "the delete retried and took B's entry";
}

}  // namespace
}  // namespace cf

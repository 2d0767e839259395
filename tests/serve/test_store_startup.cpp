// What `chunkfuse serve` finds in its store folder at start-up (issue 59): a damaged
// registered-chunk index (serve-chunks.json) is set aside with a warning and the server starts
// without it, never refusing to start; the disk tier's default budget comes from the store's
// file system (tests/serve_e2e/test_store_startup.py runs a default server on a small tmpfs).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "serve/chunk_registry.h"
#include "serve/disk_budget.h"
#include "serve/engine.h"

namespace cf {
namespace {

namespace fs = std::filesystem;

struct TempStore {
  fs::path dir = fs::temp_directory_path() / ("cf_store_startup_" + std::to_string(::getpid()));
  TempStore() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempStore() { fs::remove_all(dir); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(dir / name) << text; }
  // Files whose name starts with `prefix`.
  std::vector<fs::path> named(const std::string& prefix) const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
    return out;
  }
};

RegisteredChunk chunk_of(const std::string& text) { return {"id-" + text, text, {1, 2, 3}}; }

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Before: the constructor threw "unreadable chunk index" and the engine, hence the server,
// did not start.
TEST(StoreStartup, DamagedChunkIndexIsSetAsideAndTheRegistryStartsEmpty) {
  const std::vector<std::string> damaged = {
      "{\"version\": 1, \"chunks\": [\"Par",            // cut short (a full disk, a crash elsewhere)
      "{\"version\": 1, \"chunks\": [\"a\", 7]}",       // a wrong type
      "[]",                                             // not the index at all
      std::string(100, '[') + std::string(100, ']'),  // deeper than any index
  };
  for (const std::string& text : damaged) {
    TempStore s;
    const fs::path index = s.dir / "serve-chunks.json";
    s.write("serve-chunks.json", text);
    std::optional<ChunkRegistry> reg;
    testing::internal::CaptureStderr();
    try {
      reg.emplace(index.string(), chunk_of);
    } catch (const std::exception& e) {
      testing::internal::GetCapturedStderr();
      ADD_FAILURE() << "start-up refused over " << text.substr(0, 40) << ": " << e.what();
      continue;
    }
    const std::string log = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(reg->texts().empty());
    EXPECT_FALSE(fs::exists(index)) << "the damaged index was left in place";
    const auto aside = s.named("serve-chunks.json.damaged-");
    ASSERT_EQ(aside.size(), 1u) << "not set aside: " << text.substr(0, 40);
    EXPECT_EQ(read_all(aside[0]), text) << "the damaged file is kept as it was";
    EXPECT_NE(log.find("serve-chunks.json"), std::string::npos) << log;
    EXPECT_NE(log.find("damaged"), std::string::npos) << log;
    EXPECT_NE(log.find(aside[0].filename().string()), std::string::npos) << log;

    // The registry works from there: a new index is written and read back at the next start.
    reg->add({chunk_of("Paris is the capital of France.")});
    reg.reset();
    ChunkRegistry again(index.string(), chunk_of);
    EXPECT_EQ(again.texts(), std::vector<std::string>{"Paris is the capital of France."});
  }
}

TEST(StoreStartup, AGoodChunkIndexIsReadAsBefore) {
  TempStore s;
  s.write("serve-chunks.json", R"({"version": 1, "chunks": ["a", "b"]})");
  ChunkRegistry reg((s.dir / "serve-chunks.json").string(), chunk_of);
  EXPECT_EQ(reg.texts(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(reg.find("id-a").has_value());
  EXPECT_TRUE(s.named("serve-chunks.json.damaged-").empty());
}

// Issue 59: the knowledge base registers its chunks one at a time, and each registration
// rewrote (and fsynced) the whole index: n chunks cost n^2/2 chunk texts of writes. Now a
// registration appends its texts to serve-chunks.json.journal and the index is rewritten only
// when the journal outgrows it (and on a removal), so the bytes written stay linear; a
// registration of texts already registered writes nothing; a torn last line (a crash in
// the middle of an append) is left out when the index is read back.
TEST(StoreStartup, RegisteringChunksOneByOneWritesTheIndexInLinearBytes) {
  TempStore s;
  const std::string index = (s.dir / "serve-chunks.json").string();
  std::vector<std::string> texts;
  size_t text_bytes = 0;
  {
    ChunkRegistry reg(index, chunk_of);
    for (int i = 0; i < 400; ++i) {
      texts.push_back("chunk " + std::to_string(i) + " " + std::string(300, static_cast<char>('a' + i % 26)));
      text_bytes += texts.back().size();
      reg.add({chunk_of(texts.back())});
    }
    EXPECT_LE(reg.index_bytes_written(), 4 * text_bytes) << reg.index_writes() << " writes for " << texts.size();
    std::printf("index: %llu bytes in %llu writes for %zu bytes of text\n", (unsigned long long)reg.index_bytes_written(), (unsigned long long)reg.index_writes(), text_bytes);
    const uint64_t writes = reg.index_writes();
    reg.add({chunk_of(texts[7])});  // already registered: nothing changes, nothing is written
    EXPECT_EQ(reg.index_writes(), writes);
    EXPECT_TRUE(reg.remove("id-" + texts[3]));
  }
  std::ofstream(s.dir / "serve-chunks.json.journal", std::ios::app) << "\"torn";  // no newline
  ChunkRegistry again(index, chunk_of);
  std::vector<std::string> expect = texts;
  expect.erase(expect.begin() + 3);
  std::vector<std::string> got = again.texts();
  std::sort(got.begin(), got.end());
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(got, expect);
  EXPECT_TRUE(s.named("serve-chunks.json.damaged-").empty());
}

// Issue 59: the registered chunks are a store of their own, bounded in bytes (serve
// --registry-budget). A registration past it is 409 with nothing written or kept; a text
// already registered costs nothing; a removal gives its bytes back; an index read at start
// is kept whole even over a smaller budget (nothing stored is dropped).
TEST(StoreStartup, RegisteredChunksStayWithinTheirByteBudget) {
  TempStore s;
  const std::string index = (s.dir / "serve-chunks.json").string();
  const RegisteredChunk a = chunk_of(std::string(100, 'a')), b = chunk_of(std::string(100, 'b'));
  const size_t each = ChunkRegistry::bytes_of(a);
  ASSERT_GE(each, 100u);
  {
    ChunkRegistry reg(index, chunk_of, 2 * each + each / 2);
    reg.add({a, a});  // one id twice: counted once
    EXPECT_EQ(reg.bytes(), each);
    reg.add({b});
    const uint64_t writes = reg.index_writes();
    try {
      reg.add({chunk_of(std::string(100, 'c'))});
      ADD_FAILURE() << "a registration over the budget was accepted";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status, 409);
      EXPECT_NE(std::string(e.what()).find("--registry-budget"), std::string::npos) << e.what();
    }
    EXPECT_EQ(reg.index_writes(), writes);  // nothing written
    EXPECT_EQ(reg.texts().size(), 2u);
    reg.add({a});  // already registered: fits whatever the budget
    ASSERT_TRUE(reg.remove(a.id));
    EXPECT_EQ(reg.bytes(), each);
    reg.add({chunk_of(std::string(100, 'c'))});  // the removal made room
    EXPECT_EQ(reg.texts().size(), 2u);
  }
  ChunkRegistry smaller(index, chunk_of, each);  // over its budget from the start
  EXPECT_EQ(smaller.texts().size(), 2u);
  EXPECT_THROW(smaller.add({a}), RequestError);
}

// Half of free space plus the store's own files (a restart does not shrink it), 16 MiB to 10 GiB.
TEST(StoreStartup, DefaultDiskBudgetIsHalfTheRoomCapped) {
  constexpr uint64_t MiB = uint64_t{1} << 20, GiB = uint64_t{1} << 30;
  EXPECT_EQ(default_disk_budget(64 * MiB, 0), 32 * MiB);
  EXPECT_EQ(default_disk_budget(1 * GiB, 3 * GiB), 2 * GiB);
  EXPECT_EQ(default_disk_budget(500 * GiB, 0), kDefaultDiskBudgetCap);
  EXPECT_EQ(default_disk_budget(0, 0), kDefaultDiskBudgetFloor);  // a full disk: never 0 (unbounded)
  EXPECT_EQ(EngineOptions{}.chunk_disk_bytes, kDiskBudgetDefault) << "the engine's default is the computed budget";
  TempStore s;
  const size_t here = default_disk_budget(s.dir.string());
  EXPECT_GE(here, kDefaultDiskBudgetFloor);
  EXPECT_LE(here, kDefaultDiskBudgetCap);
}

}  // namespace
}  // namespace cf

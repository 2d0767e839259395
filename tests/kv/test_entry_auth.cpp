// Keyed integrity of cache entries (issue 17, item 6): a payload changed with its checksums
// recomputed passes the xxHash checks but never the HMAC, so it is not served.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kv/chunk_store.h"
#include "kv/entry_auth.h"
#include "kv_test_util.h"

namespace cf {
namespace {

namespace fs = std::filesystem;
using test::synthetic_cache;
using test::tiny_hparams;
using test::tiny_key;

std::shared_ptr<const EntryAuth> auth_from(const std::string& secret) {
  return std::make_shared<const EntryAuth>(std::vector<uint8_t>(secret.begin(), secret.end()));
}

ChunkStoreOptions keyed(const std::string& dir, std::shared_ptr<const EntryAuth> auth) {
  ChunkStoreOptions o;
  o.dir = dir;
  o.model = StoreModel{test::kTinyFingerprint, tiny_hparams()};
  o.auth = std::move(auth);
  o.report = [](const std::string&) {};
  return o;
}

TEST(EntryAuth, TagsDependOnKeyAndBytes) {
  const auto a = auth_from("0123456789abcdef"), b = auth_from("0123456789abcdeF");
  std::vector<uint8_t> entry{1, 2, 3, 4};
  EXPECT_NE(a->tag(entry.data(), entry.size()), b->tag(entry.data(), entry.size()));
  a->seal(entry);
  ASSERT_EQ(entry.size(), 4 + EntryAuth::kTrailerBytes);
  EXPECT_TRUE(EntryAuth::has_trailer(entry.data(), entry.size()));
  EXPECT_TRUE(a->verify(entry.data(), 4, entry.data() + 4 + 8));
  EXPECT_FALSE(b->verify(entry.data(), 4, entry.data() + 4 + 8));
  entry[0] ^= 1;
  EXPECT_FALSE(a->verify(entry.data(), 4, entry.data() + 4 + 8));
  EXPECT_THROW(EntryAuth(std::vector<uint8_t>(15, 'k')), std::invalid_argument);
}

TEST(EntryAuth, KeyFileDropsOneTrailingNewline) {
  test::TempDir dir;
  const std::string path = dir.path() + "/key";
  std::ofstream(path) << "abcdefghijklmnop\n";
  const EntryAuth from_file = EntryAuth::from_key_file(path);
  const auto direct = auth_from("abcdefghijklmnop");
  const uint8_t x[3] = {9, 8, 7};
  EXPECT_EQ(from_file.tag(x, 3), direct->tag(x, 3));
  std::ofstream(path) << "short\n";
  EXPECT_THROW(EntryAuth::from_key_file(path), std::runtime_error);
}

TEST(EntryAuth, StoreServesOnlyEntriesWithAValidTag) {
  test::TempDir dir;
  const ChunkKey k = tiny_key(4, 6);
  std::string path;
  {
    ChunkStore s(keyed(dir.path(), auth_from("the-right-key-123")));
    s.put(synthetic_cache(k, tiny_hparams()));
    path = s.path_for(k.id());
  }
  {  // Same key: served from disk.
    ChunkStore s(keyed(dir.path(), auth_from("the-right-key-123")));
    EXPECT_NE(s.get(k), nullptr);
    EXPECT_TRUE(s.verify().ok());
  }
  {  // Readers without a key ignore the trailer.
    ChunkStore s(keyed(dir.path(), nullptr));
    EXPECT_NE(s.get(k), nullptr);
  }
  {  // Another key: unauthenticated, moved aside, counted, not served.
    ChunkStore s(keyed(dir.path(), auth_from("an-attacker-key-456")));
    EXPECT_FALSE(s.verify().ok());
    EXPECT_EQ(s.get(k), nullptr);
    EXPECT_EQ(s.stats().unauthenticated_files, 1u);
    EXPECT_EQ(s.stats().corrupt_files, 1u);
    EXPECT_TRUE(fs::exists(path + ".corrupt"));
  }
}

TEST(EntryAuth, UntaggedEntryIsNotServedWhenAKeyIsSet) {
  test::TempDir dir;
  const ChunkKey k = tiny_key(5, 6);
  {
    ChunkStore s(keyed(dir.path(), nullptr));  // written without a key, as an attacker could
    s.put(synthetic_cache(k, tiny_hparams()));
  }
  ChunkStore s(keyed(dir.path(), auth_from("the-right-key-123")));
  EXPECT_EQ(s.get(k), nullptr);
  EXPECT_EQ(s.stats().unauthenticated_files, 1u);
}

}  // namespace
}  // namespace cf

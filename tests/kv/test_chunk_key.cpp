#include <gtest/gtest.h>
#include <xxhash.h>

#include <set>

#include "kv/chunk_key.h"
#include "kv_test_util.h"

namespace cf {
namespace {

TEST(ChunkKey, SerializationIsTheDocumentedLayout) {
  const std::vector<TokenId> toks = {1, 258, -1};
  KeyContext v;
  v.kind = ContextKind::after_prefix;
  for (size_t i = 0; i < 16; ++i) v.context_hash[i] = static_cast<uint8_t>(0xa0 + i);
  const std::vector<uint8_t> b = chunk_key_bytes(0x0102030405060708ull, toks, v);
  std::vector<uint8_t> want = {'C', 'F', 'C', 'H', 'U', 'N', 'K', '1', 8, 7, 6, 5, 4, 3, 2, 1, 1};
  for (size_t i = 0; i < 16; ++i) want.push_back(static_cast<uint8_t>(0xa0 + i));
  for (uint8_t x : {3, 0, 0, 0, 1, 0, 0, 0, 2, 1, 0, 0, 0xff, 0xff, 0xff, 0xff}) want.push_back(x);
  EXPECT_EQ(b, want);

  ChunkKey k(0x0102030405060708ull, toks, v);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(want.data(), want.size()));
  Hash128 h;
  std::copy(std::begin(c.digest), std::end(c.digest), h.begin());
  EXPECT_EQ(k.hash(), h);
  EXPECT_EQ(k.id(), hash128_hex(h));
  ASSERT_EQ(k.id().size(), 32u);
  for (char ch : k.id()) EXPECT_TRUE((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')) << k.id();
}

TEST(ChunkKey, EveryComponentChangesTheId) {
  const auto toks = test::tokens_for(1, 6);
  std::set<std::string> ids;
  ids.insert(ChunkKey(1, toks).id());
  ids.insert(ChunkKey(2, toks).id());                                 // model
  auto swapped = toks;
  std::swap(swapped[0], swapped[1]);
  ids.insert(ChunkKey(1, swapped).id());                              // token order
  ids.insert(ChunkKey(1, {toks.begin(), toks.end() - 1}).id());       // length
  ids.insert(ChunkKey(1, toks, KeyContext::after_prefix({})).id());  // empty prefix is not PIC
  ids.insert(ChunkKey(1, toks, KeyContext::after_prefix(std::vector<TokenId>{5})).id());
  ids.insert(ChunkKey(1, toks, KeyContext::after_prefix(std::vector<TokenId>{6})).id());
  const ChunkKey n1(1, test::tokens_for(2, 3)), n2(1, test::tokens_for(3, 3));
  const std::vector<ChunkKey> ab = {n1, n2}, ba = {n2, n1};
  ids.insert(ChunkKey(1, toks, KeyContext::neighbours({}, ab)).id());
  ids.insert(ChunkKey(1, toks, KeyContext::neighbours({}, ba)).id());  // neighbour order
  ids.insert(ChunkKey(1, toks, KeyContext::neighbours(std::vector<TokenId>{5}, ab)).id());
  EXPECT_EQ(ids.size(), 10u);
  // ...and the same inputs give the same id.
  EXPECT_EQ(ChunkKey(1, toks, KeyContext::neighbours({}, ab)).id(),
            ChunkKey(1, toks, KeyContext::neighbours({}, ab)).id());
}

TEST(ChunkKey, HexAndKindNamesRoundTrip) {
  const ChunkKey k = test::tiny_key(4);
  Hash128 h{};
  ASSERT_TRUE(parse_hash128_hex(k.id(), h));
  EXPECT_EQ(h, k.hash());
  EXPECT_FALSE(parse_hash128_hex(k.id().substr(1), h));
  std::string upper = k.id();
  upper[0] = 'G';
  EXPECT_FALSE(parse_hash128_hex(upper, h));
  for (ContextKind kind : {ContextKind::pic, ContextKind::after_prefix, ContextKind::neighbours}) {
    ContextKind back = ContextKind::pic;
    ASSERT_TRUE(parse_context_kind(context_kind_name(kind), back));
    EXPECT_EQ(back, kind);
  }
  ContextKind k2;
  EXPECT_FALSE(parse_context_kind("PIC", k2));
}

}  // namespace
}  // namespace cf

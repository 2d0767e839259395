#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kv/cache_file.h"
#include "kv_test_util.h"

namespace cf {
namespace {

using test::max_kv_diff;
using test::synthetic_cache;
using test::tiny_hparams;
using test::tiny_key;

CacheFileExpect expect_tiny(const ChunkKey& key) {
  CacheFileExpect e;
  e.model_fingerprint = test::kTinyFingerprint;
  e.hparams = tiny_hparams();
  e.key_id = key.id();
  return e;
}

// Largest |a-b| / max(|a|, tiny) over all K/V values.
float max_rel_diff(const KvCache& a, const KvCache& b) {
  float m = 0;
  for (int l = 0; l < a.n_layers(); ++l)
    for (bool is_k : {true, false}) {
      const auto xs = is_k ? test::k_rows(a, l, 0, a.size()) : test::v_rows(a, l, 0, a.size());
      const auto ys = is_k ? test::k_rows(b, l, 0, b.size()) : test::v_rows(b, l, 0, b.size());
      for (size_t i = 0; i < xs.size(); ++i) m = std::max(m, std::abs(xs[i] - ys[i]) / std::max(std::abs(xs[i]), 1e-3f));
    }
  return m;
}

TEST(CacheFile, RoundTripF32IsExact) {
  test::TempDir dir;
  const ChunkKey key = tiny_key(1, 7, KeyContext::after_prefix(std::vector<TokenId>{3, 4}));
  const ChunkCache c = synthetic_cache(key, tiny_hparams(), 2);
  const std::string path = dir.path() + "/a.cfkv";
  const size_t bytes = write_cache_file(path, c, KvDtype::f32);
  EXPECT_EQ(bytes, std::filesystem::file_size(path));
  const ChunkCache r = read_cache_file(path, expect_tiny(key));
  EXPECT_EQ(r.key.id(), key.id());
  EXPECT_EQ(r.tokens(), key.tokens());
  EXPECT_EQ(r.key.context(), key.context());
  EXPECT_EQ(r.kv.positions(), c.kv.positions());
  EXPECT_EQ(r.kv.positions().front(), 2);
  EXPECT_EQ(max_kv_diff(r.kv, c.kv), 0.f);
  EXPECT_EQ(r.offline_ms, c.offline_ms);
  EXPECT_EQ(r.created_unix_ms, c.created_unix_ms);
  EXPECT_EQ(r.extra, c.extra);
  EXPECT_EQ(r.kv.hparams().rope_base, tiny_hparams().rope_base);
}

TEST(CacheFile, RoundTripHalfPrecisionWithinTheirPrecision) {
  test::TempDir dir;
  const ChunkKey key = tiny_key(2, 9);
  const ChunkCache c = synthetic_cache(key, tiny_hparams());
  for (auto [dtype, tol] : {std::pair{KvDtype::f16, 1.0f / 1024}, std::pair{KvDtype::bf16, 1.0f / 128}}) {
    const std::string path = dir.path() + "/" + dtype_name(dtype) + ".cfkv";
    write_cache_file(path, c, dtype);
    const ChunkCache r = read_cache_file(path, expect_tiny(key));
    const float rel = max_rel_diff(c.kv, r.kv);
    EXPECT_LE(rel, tol) << dtype_name(dtype);
    if (dtype == KvDtype::f16)
      EXPECT_EQ(rel, 0.f) << "the cache stores f16: an f16 file holds it exactly";
    else
      EXPECT_GT(rel, 0.f) << dtype_name(dtype) << " should actually round";
    // Rounding in memory gives what the file gives, bit for bit.
    KvCache rounded = c.kv;
    round_to_dtype(rounded, dtype);
    EXPECT_EQ(max_kv_diff(rounded, r.kv), 0.f) << dtype_name(dtype);
    // Half-precision files are about half the f32 size.
    EXPECT_LT(std::filesystem::file_size(path), encode_cache_file(c, KvDtype::f32).size() * 0.6);
  }
}

TEST(CacheFile, Bf16RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  float f;
  uint32_t u = 0x3f808000;  // exactly halfway between 0x3f80 and 0x3f81: ties to even
  std::memcpy(&f, &u, 4);
  EXPECT_EQ(fp32_to_bf16(f), 0x3f80);
  u = 0x3f818000;  // halfway between 0x3f81 and 0x3f82
  std::memcpy(&f, &u, 4);
  EXPECT_EQ(fp32_to_bf16(f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(-2.5f)), -2.5f);
}

TEST(CacheFile, HeaderFieldsAtDocumentedOffsets) {
  const ChunkKey key = tiny_key(3, 4);
  const ChunkCache c = synthetic_cache(key, tiny_hparams());
  const auto b = encode_cache_file(c, KvDtype::f16);
  auto u32 = [&](size_t o) { uint32_t v; std::memcpy(&v, &b[o], 4); return v; };
  auto u64 = [&](size_t o) { uint64_t v; std::memcpy(&v, &b[o], 8); return v; };
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "CFKVCACH");
  EXPECT_EQ(u32(8), kCacheFileVersion);
  EXPECT_EQ(u32(12), kCacheFileHeaderSize);
  EXPECT_EQ(u64(16), test::kTinyFingerprint);
  EXPECT_EQ(u32(24), 1u);  // f16
  EXPECT_EQ(u32(28), 3u);
  EXPECT_EQ(u32(32), 2u);
  EXPECT_EQ(u32(36), 8u);
  EXPECT_EQ(u64(40), 4u);
  EXPECT_EQ(0, std::memcmp(&b[48], key.hash().data(), 16));
  const uint64_t meta_len = u64(64), payload_len = u64(72);
  EXPECT_EQ(payload_len, 2u * 3 * 4 * 16 * 2);
  EXPECT_EQ(b.size() % 64, 0u);  // the payload starts 64-aligned and its length here is a multiple of 64
  EXPECT_EQ(b.size() - payload_len, (128 + 8 * 4 + meta_len + 63) / 64 * 64);
  for (int i = 0; i < 4; ++i) {
    int32_t t;
    std::memcpy(&t, &b[128 + 4 * i], 4);
    EXPECT_EQ(t, key.tokens()[i]);
  }
  const std::string meta(b.begin() + 128 + 32, b.begin() + 128 + 32 + static_cast<long>(meta_len));
  const auto j = nlohmann::json::parse(meta);
  EXPECT_EQ(j.at("key_id"), key.id());
  EXPECT_EQ(j.at("variant").at("kind"), "pic");
  for (int i = 96; i < 128; ++i) EXPECT_EQ(b[i], 0) << "reserved byte " << i;
}

TEST(CacheFile, InfoReadsHeaderAndMetadata) {
  test::TempDir dir;
  const ChunkKey key = tiny_key(5, 6, KeyContext::after_prefix(std::vector<TokenId>{9}));
  const std::string path = dir.path() + "/x.cfkv";
  const size_t bytes = write_cache_file(path, synthetic_cache(key, tiny_hparams()), KvDtype::bf16);
  const CacheFileInfo info = read_cache_file_info(path);
  EXPECT_EQ(info.key_id, key.id());
  EXPECT_EQ(info.n_tokens, 6u);
  EXPECT_EQ(info.file_bytes, bytes);
  EXPECT_EQ(info.dtype, KvDtype::bf16);
  EXPECT_EQ(info.kind, ContextKind::after_prefix);
  EXPECT_EQ(info.n_layers, 3);
  EXPECT_EQ(info.offline_ms, 12.5);
  EXPECT_EQ(info.created_unix_ms, 1700000000123);
}

TEST(CacheFile, AtomicWriteLeavesOnlyTheFinalFile) {
  test::TempDir dir;
  const ChunkKey key = tiny_key(6);
  const std::string path = dir.path() + "/k.cfkv";
  for (int i = 0; i < 3; ++i) write_cache_file(path, synthetic_cache(key, tiny_hparams()), KvDtype::f16);
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "k.cfkv");
  }
  EXPECT_EQ(files, 1u);
  // A directory that does not exist is an I/O error naming the file, not a crash.
  try {
    write_cache_file(dir.path() + "/missing/k.cfkv", synthetic_cache(key, tiny_hparams()), KvDtype::f16);
    FAIL() << "expected an error";
  } catch (const CacheFileError& e) {
    EXPECT_EQ(e.reason(), CacheFileDefect::io_error);
    EXPECT_NE(std::string(e.what()).find("missing/k.cfkv"), std::string::npos) << e.what();
  }
}

TEST(CacheFile, MissingFileIsNotFound) {
  try {
    read_cache_file("/nonexistent/dir/x.cfkv");
    FAIL();
  } catch (const CacheFileError& e) {
    EXPECT_EQ(e.reason(), CacheFileDefect::not_found);
  }
}

TEST(CacheFile, KeyMismatchWhenFileHoldsAnotherKey) {
  test::TempDir dir;
  const ChunkKey a = tiny_key(7), b = tiny_key(8);
  const std::string path = dir.path() + "/a.cfkv";
  write_cache_file(path, synthetic_cache(a, tiny_hparams()), KvDtype::f16);
  try {
    read_cache_file(path, expect_tiny(b));
    FAIL();
  } catch (const CacheFileError& e) {
    EXPECT_EQ(e.reason(), CacheFileDefect::key_mismatch) << e.what();
  }
}

}  // namespace
}  // namespace cf

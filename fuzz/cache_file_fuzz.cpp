// libFuzzer target for the chunk-cache file decoder (issue 24): decode_cache_file must accept
// or refuse any bytes with a CacheFileError, never crash, hang or read out of bounds.
// First byte: even = the input itself is the file image; odd = a valid image (a small
// synthetic cache, one of two shapes) with the input's
// bytes written over it at offsets the input chooses, so the fuzzer starts past the magic and
// the checksums and reaches the metadata JSON and the body.
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kv/cache_file.h"
#include "kv/chunk_cache.h"

namespace {
constexpr uint64_t kFingerprint = 0x1234abcd5678ef00ull;

// A small cache with deterministic K/V (as tests/kv/kv_test_util.h makes them).
cf::ChunkCache synthetic(int n_layers, int n_kv_heads, int head_dim, size_t n, int32_t first_pos) {
  cf::ModelHparams h;
  h.arch = "llama";
  h.n_layers = n_layers;
  h.d_model = 32;
  h.n_heads = 4;
  h.n_kv_heads = n_kv_heads;
  h.head_dim = head_dim;
  h.d_ff = 64;
  h.vocab_size = 1000;
  h.context_length = 4096;
  h.rope_dims = head_dim;
  std::vector<cf::TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<cf::TokenId>((first_pos * 7919 + static_cast<int>(i) * 31) % 1000);
  cf::KvCache kv(h, n);
  kv.append(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 2.f);
  for (size_t i = 0; i < n; ++i) kv.set_position(i, first_pos + static_cast<int32_t>(i));
  std::vector<float> k(n * kv.kv_dim()), v(n * kv.kv_dim());
  for (int l = 0; l < n_layers; ++l) {
    for (size_t i = 0; i < k.size(); ++i) k[i] = dist(rng), v[i] = dist(rng);
    kv.write_k(l, 0, n, k.data());
    kv.write_v(l, 0, n, v.data());
  }
  cf::ChunkCache c(cf::ChunkKey(kFingerprint, t), std::move(kv));
  c.extra = {{"anchors", {1, 2, 3}}, {"note", "fuzz seed"}};
  return c;
}

const std::vector<uint8_t>& valid(int which) {
  static const std::vector<uint8_t> images[2] = {
      cf::encode_cache_file(synthetic(2, 1, 4, 6, 0), cf::KvDtype::f16),
      cf::encode_cache_file(synthetic(1, 2, 8, 3, 40), cf::KvDtype::f16)};
  return images[which];
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<uint8_t> image;
  if (data[0] % 2 == 0) {
    image.assign(data + 1, data + size);
  } else {
    if (size < 2) return 0;
    image = valid(data[1] % 2);
    // Pairs (offset, byte): offset in 2 bytes, scaled over the image; a length byte 0xff
    // truncates instead.
    for (size_t i = 2; i + 2 < size; i += 3) {
      const size_t off = (static_cast<size_t>(data[i]) << 8 | data[i + 1]) % (image.size() + 1);
      if (data[i + 2] == 0xff && off < image.size()) {
        image.resize(off);
        break;
      }
      if (off < image.size()) image[off] = data[i + 2];
    }
  }
  cf::CacheFileExpect plain;
  cf::CacheFileExpect strict;
  strict.model_fingerprint = kFingerprint;
  // (No auth here: the images carry no HMAC trailer; remote_entry_fuzz covers the tag.)
  for (const cf::CacheFileExpect* e : {&plain, &strict}) {
    try {
      const cf::ChunkCache c = cf::decode_cache_file(image.data(), image.size(), "fuzz", *e);
      if (c.kv.size() != c.tokens().size()) __builtin_trap();  // a decoded cache is consistent
    } catch (const cf::CacheFileError&) {
    }
  }
  return 0;
}

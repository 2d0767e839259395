// libFuzzer target for the chunk-cache file decoder (issue 24): decode_cache_file must accept
// or refuse any bytes with a CacheFileError, never crash, hang or read out of bounds.
// First byte: even = the input itself is the file image; odd = a valid image (a small
// synthetic cache, one of two shapes) with the input's
// bytes written over it at offsets the input chooses, so the fuzzer starts past the magic and
// the checksums and reaches the metadata JSON and the body.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/cache_file.h"
#include "kv/chunk_cache.h"
#include "kv/kv_test_util.h"  // tests/kv: the synthetic caches of the kv tests

namespace {
using cf::test::kTinyFingerprint;

// A small cache with deterministic K/V, the kv tests' own synthetic cache.
cf::ChunkCache synthetic(int n_layers, int n_kv_heads, int head_dim, size_t n, int32_t first_pos) {
  cf::ChunkCache c = cf::test::synthetic_cache(cf::ChunkKey(kTinyFingerprint, cf::test::tokens_for(first_pos, n)),
                                               cf::test::tiny_hparams(n_layers, n_kv_heads, head_dim), first_pos);
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
  strict.model_fingerprint = kTinyFingerprint;
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

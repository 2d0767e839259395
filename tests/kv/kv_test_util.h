// Helpers for the kv tests: a small synthetic model shape, deterministic chunk caches
// (so a "recompute" reproduces the original exactly) and temp directories.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kv/chunk_cache.h"
#include "kv/chunk_key.h"
#include "runtime/kv_rows.h"

namespace cf::test {

inline ModelHparams tiny_hparams(int n_layers = 3, int n_kv_heads = 2, int head_dim = 8) {
  ModelHparams h;
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
  return h;
}

inline constexpr uint64_t kTinyFingerprint = 0x1234abcd5678ef00ull;

inline std::vector<TokenId> tokens_for(int seed, size_t n) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((seed * 7919 + static_cast<int>(i) * 31) % 1000);
  return t;
}

// K/V values are a pure function of the key id, so computing twice gives equal caches.
inline ChunkCache synthetic_cache(const ChunkKey& key, const ModelHparams& h, int32_t first_pos = 0) {
  const size_t n = key.tokens().size();
  KvCache kv(h, n);
  kv.append(n);
  std::seed_seq seq(key.id().begin(), key.id().end());
  std::mt19937 rng(seq);
  std::normal_distribution<float> dist(0.f, 2.f);
  for (size_t i = 0; i < n; ++i) kv.set_position(i, first_pos + static_cast<int32_t>(i));
  std::vector<float> k(n * kv.kv_dim()), v(n * kv.kv_dim());
  for (int l = 0; l < h.n_layers; ++l) {
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = dist(rng);
      v[i] = dist(rng);
    }
    kv.write_k(l, 0, n, k.data());  // rounded to f16, as the cache stores them
    kv.write_v(l, 0, n, v.data());
  }
  ChunkCache c(key, std::move(kv));
  c.offline_ms = 12.5;
  c.created_unix_ms = 1700000000123;
  c.extra = {{"anchors", {1, 2, 3}}, {"note", "synthetic"}};
  return c;
}

inline ChunkKey tiny_key(int seed, size_t n = 5, KeyContext v = KeyContext::pic()) {
  return ChunkKey(kTinyFingerprint, tokens_for(seed, n), v);
}

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = (std::filesystem::temp_directory_path() /
             ("cf_kv_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd())))
                .string();
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Max |a - b| over all K/V values, and whether positions match.
inline float max_kv_diff(const KvCache& a, const KvCache& b) {
  if (a.size() != b.size() || a.n_layers() != b.n_layers() || a.kv_dim() != b.kv_dim()) return INFINITY;
  float m = 0;
  for (int l = 0; l < a.n_layers(); ++l)
    for (bool is_k : {true, false}) {
      const auto x = is_k ? k_rows(a, l, 0, a.size()) : v_rows(a, l, 0, a.size());
      const auto y = is_k ? k_rows(b, l, 0, b.size()) : v_rows(b, l, 0, b.size());
      for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
    }
  return m;
}

// Max |value| over all K/V values.
inline float max_abs_kv(const KvCache& a) {
  float m = 0;
  for (int l = 0; l < a.n_layers(); ++l)
    for (const auto& rows : {k_rows(a, l, 0, a.size()), v_rows(a, l, 0, a.size())})
      for (float x : rows) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace cf::test

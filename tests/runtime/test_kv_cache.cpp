// KvCache's f16 storage: what goes in comes back exactly when it is f16-exact, other
// floats are rounded to the nearest f16, and the memory is 2 bytes per value.
#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <vector>

#include "kv_rows.h"
#include "model/kernels.h"
#include "runtime/kv_cache.h"

namespace cf {
namespace {

ModelHparams small_shape() {
  ModelHparams h;
  h.n_layers = 3;
  h.n_heads = 4;
  h.n_kv_heads = 2;
  h.head_dim = 16;
  h.d_model = 64;
  return h;
}

TEST(KvCache, F16ExactValuesRoundTripBitForBit) {
  const ModelHparams h = small_shape();
  KvCache c(h);
  const size_t n = 37;
  const size_t kvd = static_cast<size_t>(h.kv_dim());
  c.append(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 4.f);
  for (int l = 0; l < h.n_layers; ++l) {
    std::vector<float> k(n * kvd), v(n * kvd);
    for (auto& x : k) x = fp16_to_fp32(fp32_to_fp16(nd(rng)));
    for (auto& x : v) x = fp16_to_fp32(fp32_to_fp16(nd(rng) * 1e-4f));  // subnormal f16s among them
    k[0] = -0.f;
    v[1] = 65504.f;
    c.write_k(l, 0, n, k.data());
    c.write_v(l, 0, n, v.data());
    const auto k_back = test::k_rows(c, l, 0, n), v_back = test::v_rows(c, l, 0, n);
    for (size_t i = 0; i < k.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(k_back[i]), std::bit_cast<uint32_t>(k[i])) << l << " " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(v_back[i]), std::bit_cast<uint32_t>(v[i])) << l << " " << i;
    }
    // Raw rows are the f16 bits of the same values, a slot's row right after the previous.
    EXPECT_EQ(c.k_f16(l, 5)[3], fp32_to_fp16(k[5 * kvd + 3]));
    EXPECT_EQ(c.v_f16(l, 0) + kvd, c.v_f16(l, 1));
  }
}

TEST(KvCache, OtherFloatsAreRoundedToNearestEven) {
  const ModelHparams h = small_shape();
  KvCache c(h, 1);
  c.append(1);
  std::vector<float> k(h.kv_dim(), 1.0f);
  k[0] = 1.00048828125f;  // halfway between 1 and 1 + 2^-10: ties to even (1)
  k[1] = 1.00146484375f;  // halfway between 1 + 2^-10 and 1 + 2^-9: to 1 + 2^-9
  k[2] = 0.1f;
  c.write_k(0, 0, 1, k.data());
  const auto back = test::k_rows(c, 0, 0);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.001953125f);
  EXPECT_EQ(back[2], fp16_to_fp32(fp32_to_fp16(0.1f)));
  EXPECT_NE(back[2], 0.1f);
}

TEST(KvCache, HoldsTwoBytesPerValue) {
  const ModelHparams h = small_shape();
  KvCache c(h, 100);
  EXPECT_EQ(KvCache::kValueBytes, 2u);
  EXPECT_EQ(c.bytes(), 2u * h.n_layers * 100 * h.kv_dim() * 2);  // K and V, 100 entries, 2 bytes each
  c.append(150);  // grows to max(150, 2 * 100)
  EXPECT_EQ(c.bytes(), 2u * h.n_layers * 200 * h.kv_dim() * 2);
}

// Moved keys: f16 in, rotated in float, rounded back; values untouched.
TEST(KvCache, ShiftRotatesKeysAndKeepsValues) {
  const ModelHparams h = small_shape();
  KvCache c(h);
  c.append(2);
  std::vector<float> k(2 * h.kv_dim()), v(2 * h.kv_dim());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i % 7) - 3.f;
    v[i] = 0.5f * static_cast<float>(i);
  }
  for (int l = 0; l < h.n_layers; ++l) {
    c.write_k(l, 0, 2, k.data());
    c.write_v(l, 0, 2, v.data());
  }
  KvCache moved = c;
  moved.shift(0, 2, 9);
  moved.shift(0, 2, -9);
  EXPECT_EQ(moved.position(0), 0);
  for (int l = 0; l < h.n_layers; ++l) {
    EXPECT_EQ(test::v_rows(moved, l, 0, 2), v);
    const auto back = test::k_rows(moved, l, 0, 2);
    for (size_t i = 0; i < k.size(); ++i) EXPECT_NEAR(back[i], k[i], 4e-3f) << i;  // two f16 roundings
  }
  moved.shift(0, 2, 9);
  EXPECT_NE(test::k_rows(moved, 1, 1), test::k_rows(c, 1, 1));
}

}  // namespace
}  // namespace cf

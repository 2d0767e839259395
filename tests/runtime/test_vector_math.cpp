#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "model/kernels.h"
#include "runtime/vector_math.h"

namespace cf {
namespace {

// Our branch-free f16 rounding against the kernels' reference conversion, on every f16
// neighbourhood that matters: normals, subnormals, ties, zero and sign.
TEST(VectorMath, RoundToF16MatchesTheReferenceConversion) {
  std::mt19937 rng(1);
  std::vector<float> xs = {0.f, -0.f, 1.f, -1.f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f,
                           1.0009766f, 1.00048828125f, 1.00146484375f, 3e-06f, -7.2e-07f};
  for (int i = 0; i < 200000; ++i) {
    const float mag = std::ldexp(std::uniform_real_distribution<float>(1.f, 2.f)(rng), static_cast<int>(rng() % 44) - 28);
    xs.push_back(rng() & 1 ? mag : -mag);
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite f16, and halfway points above each
    const float v = fp16_to_fp32(static_cast<uint16_t>(h));
    xs.push_back(v);
    xs.push_back(std::nextafter(v, 1e9f));
    const float next = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    xs.push_back((v + next) / 2);
  }
  for (float x : xs) {
    if (std::fabs(x) >= 65520.f) continue;  // beyond f16's range: documented as not handled
    float got = x;
    round_to_f16(&got, 1);
    const float want = fp16_to_fp32(fp32_to_fp16(x));
    ASSERT_EQ(got, want) << "x = " << x;
  }
}

// The KV cache's conversions, under every ISA (F16C and the portable bit code), against
// the reference: f16 -> float exactly for every bit pattern, float -> f16 rounding to
// nearest even with infinity beyond the range. Lengths not a multiple of 8 exercise the
// tails of the vector loops.
TEST(VectorMath, F16ConversionsMatchTheReferenceOnEveryIsa) {
  std::vector<uint16_t> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::mt19937 rng(2);
  std::vector<float> xs = {0.f, -0.f, 65504.f, 65519.f, 65520.f, -70000.f, 1e30f, INFINITY, -INFINITY, NAN,
                           5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 1e-30f, -3e-06f};
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite f16 and the halfway point above it
    const float v = fp16_to_fp32(static_cast<uint16_t>(h));
    xs.push_back(v);
    xs.push_back(-(v + fp16_to_fp32(static_cast<uint16_t>(h + 1))) / 2);
  }
  for (int i = 0; i < 100001; ++i) xs.push_back(std::ldexp(std::normal_distribution<float>(0.f, 1.f)(rng), static_cast<int>(rng() % 50) - 30));
  const Isa best = detect_isa();
  for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512}) {
    if (isa > best) continue;
    force_isa(isa);
    std::vector<float> f(all.size());
    f16_to_f32(all.data(), f.data(), all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      const float want = fp16_to_fp32(all[i]);
      if (std::isnan(want))
        ASSERT_TRUE(std::isnan(f[i])) << isa_name(isa) << " h = " << all[i];
      else
        ASSERT_EQ(std::bit_cast<uint32_t>(f[i]), std::bit_cast<uint32_t>(want)) << isa_name(isa) << " h = " << all[i];
    }
    std::vector<uint16_t> h(xs.size());
    f32_to_f16(xs.data(), h.data(), xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      if (std::isnan(xs[i]))
        ASSERT_TRUE(std::isnan(fp16_to_fp32(h[i]))) << isa_name(isa);
      else
        ASSERT_EQ(h[i], fp32_to_fp16(xs[i])) << isa_name(isa) << " x = " << xs[i];
    }
  }
  force_isa(best);
}

TEST(VectorMath, ExpApproximationIsAccurate) {
  for (float x = -80.f; x < 80.f; x += 0.37f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(exp_approx(x) / want, 1.0, 5e-7) << x;
  }
}

}  // namespace
}  // namespace cf

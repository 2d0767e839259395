#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

TEST(VectorMath, ExpApproximationIsAccurate) {
  for (float x = -80.f; x < 80.f; x += 0.37f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(exp_approx(x) / want, 1.0, 5e-7) << x;
  }
}

}  // namespace
}  // namespace cf

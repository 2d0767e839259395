// Llama 3 RoPE scaling (rope_freqs.weight): each pair's angle is divided by its factor.
// The end-to-end check against llama.cpp is ShapesSlow (test_shapes.cpp); its prompts are
// short, where the scaled (low-frequency) pairs hardly turn, so the formula is checked here
// at far positions.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "runtime/rope.h"

namespace cf {
namespace {

// One head of 64 with Llama 3.2's factors: 1 for short wavelengths, 32 for long, a ramp between.
std::vector<float> llama3_factors(int head_dim, double base) {
  std::vector<float> f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    const double wavelen = 2 * std::numbers::pi * std::pow(base, 2.0 * i / head_dim);
    if (wavelen < 2048) f[i] = 1;
    else if (wavelen > 8192) f[i] = 32;
    else {
      const double smooth = (8192 / wavelen - 1) / 3;
      f[i] = static_cast<float>(1 / ((1 - smooth) / 32 + smooth));
    }
  }
  return f;
}

TEST(RopeScaling, AnglesAreDividedByTheFactors) {
  const int d = 64;
  const float base = 500000.f;
  const auto f = llama3_factors(d, base);
  ASSERT_EQ(f.front(), 1.0f);
  ASSERT_EQ(f.back(), 32.0f);
  for (double pos : {3.0, 5000.0, 60000.0}) {
    std::vector<float> x(d), y(d);
    for (int i = 0; i < d; ++i) x[i] = y[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
    rope_rotate(y.data(), 1, d, pos, base, RopeStyle::Normal, f.data());
    for (int i = 0; i < d / 2; ++i) {
      // float angles, as the recurrence computes them: compare in the rotation's own precision
      const double theta = pos * std::pow(static_cast<double>(base), -2.0 * i / d);
      const double angle = theta / f[i];
      const double a = x[2 * i], b = x[2 * i + 1];
      // The float recurrence theta_{i+1} = theta_i * base^(-2/d) drifts by a few ulps per
      // step, relative to theta: a tolerance relative to the unscaled angle.
      const double tol = 1e-5 + 4e-6 * theta;
      EXPECT_NEAR(y[2 * i], a * std::cos(angle) - b * std::sin(angle), tol) << "pos " << pos << " pair " << i;
      EXPECT_NEAR(y[2 * i + 1], a * std::sin(angle) + b * std::cos(angle), tol) << "pos " << pos << " pair " << i;
    }
  }
}

TEST(RopeScaling, UnitFactorsChangeNothingAndRotationsCompose) {
  const int d = 64, heads = 3;
  const float base = 500000.f;
  const std::vector<float> ones(d / 2, 1.0f);
  const auto f = llama3_factors(d, base);
  std::vector<float> x(heads * d);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.11f * static_cast<float>(i));
  for (RopeStyle style : {RopeStyle::Normal, RopeStyle::Neox}) {
    auto a = x, b = x;
    rope_rotate(a.data(), heads, d, 777, base, style);
    rope_rotate(b.data(), heads, d, 777, base, style, ones.data());
    EXPECT_EQ(a, b) << "factors of 1 must be bit-identical to no factors";
    // Rotating by p then by -p (what KvCache::shift does to move a chunk) restores the keys.
    auto c = x;
    rope_rotate(c.data(), heads, d, 4321, base, style, f.data());
    rope_rotate(c.data(), heads, d, -4321, base, style, f.data());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(c[i], x[i], 1e-5f);
  }
}

}  // namespace
}  // namespace cf

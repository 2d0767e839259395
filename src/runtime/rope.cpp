#include "runtime/rope.h"

#include <cmath>
#include <vector>

namespace cf {

void rope_rotate(float* x, int n_heads, int head_dim, double pos, float base, RopeStyle style,
                 const float* freq_factors) {
  const int half = head_dim / 2;
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(head_dim));
  // One cos/sin per pair, shared by all heads.
  float cs[256], sn[256];
  std::vector<float> cs_heap, sn_heap;
  float* c = cs;
  float* s = sn;
  if (half > 256) {
    cs_heap.resize(half);
    sn_heap.resize(half);
    c = cs_heap.data();
    s = sn_heap.data();
  }
  float theta = static_cast<float>(pos);
  for (int i = 0; i < half; ++i) {
    // llama.cpp divides the recurrence's angle by the factor, leaving the recurrence as is.
    const float angle = freq_factors ? theta / freq_factors[i] : theta;
    c[i] = std::cos(angle);
    s[i] = std::sin(angle);
    theta *= theta_scale;
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    // The products fused as llama.cpp's build (GCC, -ffp-contract=fast) fuses them, so both
    // engines round alike: fma(a, c, -(b s)) and fma(a, s, b c) (checked bit for bit
    // against its RoPE output).
    if (style == RopeStyle::Normal) {
      for (int i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = std::fma(a, c[i], -(b * s[i]));
        v[2 * i + 1] = std::fma(a, s[i], b * c[i]);
      }
    } else {
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = std::fma(a, c[i], -(b * s[i]));
        v[i + half] = std::fma(a, s[i], b * c[i]);
      }
    }
  }
}

}  // namespace cf

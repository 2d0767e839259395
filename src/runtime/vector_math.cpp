#include "runtime/vector_math.h"

#include <cmath>

#include "runtime/vector_math_impl.h"

namespace cf {

CF_MULTIVERSION void rms_norm(const float* x, const float* w, float* y, size_t n, float eps) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);  // float product, as ggml
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

CF_MULTIVERSION void silu_mul(float* gate, const float* up, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + detail::exp_inline(-g)) * up[i];
  }
}

void gelu_mul(float* gate, const float* up, size_t n) {
  // tanh approximation, as ggml's gelu
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float t = std::tanh(0.7978845608028654f * (g + 0.044715f * g * g * g));
    gate[i] = 0.5f * g * (1.0f + t) * up[i];
  }
}

CF_MULTIVERSION void add_inplace(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

CF_MULTIVERSION void round_to_f16(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<_Float16>(x[i]));
}

float exp_approx(float x) { return detail::exp_inline(x); }

}  // namespace cf

#include "runtime/vector_math.h"

#include <cmath>

#include "runtime/runtime_kernels.h"

namespace cf {

void rms_norm(const float* x, const float* w, float* y, size_t n, float eps) { rk::active().rms_norm(x, w, y, n, eps); }

void silu_mul(float* gate, const float* up, size_t n) { rk::active().silu_mul(gate, up, n); }

void gelu_mul(float* gate, const float* up, size_t n) {
  // tanh approximation, as ggml's gelu
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float t = std::tanh(0.7978845608028654f * (g + 0.044715f * g * g * g));
    gate[i] = 0.5f * g * (1.0f + t) * up[i];
  }
}

void add_inplace(float* y, const float* x, size_t n) { rk::active().add_inplace(y, x, n); }

void round_to_f16(float* x, size_t n) { rk::active().round_to_f16(x, n); }

void f16_to_f32(const uint16_t* x, float* y, size_t n) { rk::active().f16_to_f32(x, y, n); }

void f32_to_f16(const float* x, uint16_t* y, size_t n) { rk::active().f32_to_f16(x, y, n); }

float exp_approx(float x) { return rk::active().exp(x); }

}  // namespace cf

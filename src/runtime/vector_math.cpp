#include "runtime/vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/sanitizer.h"
#include "runtime/runtime_kernels.h"

namespace cf {

// The ISA kernels are not instrumented in the sanitizer build: their regions are checked
// here (base/sanitizer.h).
void rms_norm(const float* x, const float* w, float* y, size_t n, float eps) {
  check_kernel_region("rms_norm x", x, n * sizeof(float));
  check_kernel_region("rms_norm w", w, n * sizeof(float));
  check_kernel_region("rms_norm y", y, n * sizeof(float));
  rk::active().rms_norm(x, w, y, n, eps);
}

void silu_mul(float* gate, const float* up, size_t n) {
  check_kernel_region("silu_mul gate", gate, n * sizeof(float));
  check_kernel_region("silu_mul up", up, n * sizeof(float));
  rk::active().silu_mul(gate, up, n);
}

namespace {
// ggml's GELU (tanh approximation) as its CPU backend runs it: gelu of x rounded to f16,
// looked up in a table of f16 results (GGML_GELU_FP16), 0 below -10 and identity above 10.
// The table entry is f16(0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))) with the inner
// product-sum fused as GCC fuses ggml's expression.
const std::vector<float>& gelu_f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t bits = static_cast<uint16_t>(i);
      float x;
      f16_to_f32(&bits, &x, 1);
      const float inner = std::fma(0.044715f * x, x, 1.0f);
      const float g = 0.5f * x * (1.0f + std::tanh(0.79788456080286535587989211986876f * x * inner));
      uint16_t r;
      f32_to_f16(&g, &r, 1);
      f16_to_f32(&r, &t[i], 1);
    }
    return t;
  }();
  return table;
}
}  // namespace

void gelu_mul(float* gate, const float* up, size_t n) {
  // ggml_vec_geglu_f32 (Gemma's GeGLU, ggml_geglu_split): gelu(gate) * up.
  const std::vector<float>& table = gelu_f16_table();
  uint16_t bits[256];
  for (size_t b = 0; b < n; b += 256) {
    const size_t m = std::min<size_t>(256, n - b);
    f32_to_f16(gate + b, bits, m);
    for (size_t i = 0; i < m; ++i) {
      const float g = gate[b + i];
      gate[b + i] = g <= -10.0f ? 0.0f : g >= 10.0f ? g * up[b + i] : table[bits[i]] * up[b + i];
    }
  }
}

void add_inplace(float* y, const float* x, size_t n) {
  check_kernel_region("add_inplace y", y, n * sizeof(float));
  check_kernel_region("add_inplace x", x, n * sizeof(float));
  rk::active().add_inplace(y, x, n);
}

void round_to_f16(float* x, size_t n) {
  check_kernel_region("round_to_f16", x, n * sizeof(float));
  rk::active().round_to_f16(x, n);
}

void f16_to_f32(const uint16_t* x, float* y, size_t n) {
  check_kernel_region("f16_to_f32 x", x, n * sizeof(uint16_t));
  check_kernel_region("f16_to_f32 y", y, n * sizeof(float));
  rk::active().f16_to_f32(x, y, n);
}

void f32_to_f16(const float* x, uint16_t* y, size_t n) {
  check_kernel_region("f32_to_f16 x", x, n * sizeof(float));
  check_kernel_region("f32_to_f16 y", y, n * sizeof(uint16_t));
  rk::active().f32_to_f16(x, y, n);
}

float exp_approx(float x) { return rk::active().exp(x); }

}  // namespace cf

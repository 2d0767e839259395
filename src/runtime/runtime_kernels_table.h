// One ISA's RuntimeKernels table from its hooks (Ops: ScalarOps in
// runtime_kernels_scalar.h, hidden where the ISA's file vectorizes): the attention tile of
// attention_llama_order.h and the small kernels below, plain loops written so the compiler
// vectorizes them for the including file's ISA. Each runtime_kernels_<isa>.cpp instantiates
// it once with its own flags (internal linkage on purpose).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "model/kernels.h"
#include "runtime/attention_llama_order.h"
#include "runtime/runtime_kernels.h"
#include "runtime/runtime_kernels_scalar.h"

namespace cf::rk {
namespace {

inline void rms_norm(const float* x, const float* w, float* y, size_t n, float eps) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);  // float product, as ggml
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

template <class Ops>
void silu_mul(float* gate, const float* up, size_t n) {
  for (size_t i = Ops::silu_mul_prefix(gate, up, n); i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + exp_inline(0.0f - g)) * up[i];  // ggml_v_silu, then the swiglu product
  }
}

inline void add_inplace(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

inline void round_to_f16(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = round_f16(x[i]);
}

template <class Ops>
void f16_to_f32(const uint16_t* x, float* y, size_t n) { f16_to_f32_row<Ops>(x, y, n); }

// Round to nearest even, infinity beyond the f16 range (F16C's conversion; the scalar
// tail is model/kernels.h's reference, which rounds alike).
template <class Ops>
void f32_to_f16(const float* __restrict x, uint16_t* __restrict y, size_t n) {
  for (size_t i = Ops::f32_to_f16_prefix(x, y, n); i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

inline float exp_scalar(float x) { return exp_inline(x); }

template <class Ops>
const RuntimeKernels& runtime_kernels_table() {
  static const RuntimeKernels k{attend_tile<Ops>, attention_probs_row<Ops>, rms_norm,       silu_mul<Ops>,
                                add_inplace,      round_to_f16,             f16_to_f32<Ops>, f32_to_f16<Ops>,
                                exp_scalar,       Ops::kBatchedTaskQueries};
  return k;
}

}  // namespace
}  // namespace cf::rk

// Elementwise math of the forward pass, written as plain loops and compiled in several
// ISA variants (GCC function multi-versioning picks one at load time).
#pragma once
#include <cstddef>
#include <cstdint>

namespace cf {

// y = x / sqrt(mean(x^2) + eps) * w  (mean accumulated in double, as llama.cpp does)
void rms_norm(const float* x, const float* w, float* y, size_t n, float eps);
// gate[i] = silu(gate[i]) * up[i]
void silu_mul(float* gate, const float* up, size_t n);
void gelu_mul(float* gate, const float* up, size_t n);
void add_inplace(float* y, const float* x, size_t n);
// Rounds to the nearest f16 value (kept as float): K and V are rounded as the KV cache
// stores them (f16, as llama.cpp's default cache), so that hooks see the values attention
// uses and both engines attend over the same numbers.
void round_to_f16(float* x, size_t n);
// IEEE f16 bit patterns (the KV cache's storage) to float, exact.
void f16_to_f32(const uint16_t* x, float* y, size_t n);
// Float to f16 bits, round to nearest even (infinity beyond the f16 range).
void f32_to_f16(const float* x, uint16_t* y, size_t n);
// exp for the softmax and SiLU: ggml's vectorized expf, bit for bit (max error about 1.5 ulp;
// 0 below about -104, infinity above about 88.4).
float exp_approx(float x);

}  // namespace cf

// Rotary position embedding. Angles follow llama.cpp's recurrence (theta_0 = pos,
// theta_{i+1} = theta_i * base^(-2/d)) so that our keys match its keys bit for bit as
// far as float arithmetic allows.
#pragma once
#include <cstdint>

#include "model/arch.h"

namespace cf {

// Rotates `n_heads` consecutive heads of size head_dim in place by position `pos`
// (pos may be negative: rotating by -p undoes a rotation by p). freq_factors, when given,
// holds head_dim/2 divisors of the angles (Llama 3 scaling, ModelHparams::rope_freq_factors).
void rope_rotate(float* x, int n_heads, int head_dim, double pos, float base, RopeStyle style,
                 const float* freq_factors = nullptr);

}  // namespace cf

// The scalar float steps every ISA's runtime kernels share (ggml's expf, reduce16, f16
// rounding and conversion), and ScalarOps: the hooks through which attention_llama_order.h
// and runtime_kernels_table.h reach an ISA's vector code, in their scalar (portable) form.
// An ISA's struct derives from ScalarOps<itself> and hides the hooks it vectorizes
// (runtime_kernels_avx2.cpp, runtime_kernels_avx512.cpp); a hook returning false or 0 means
// "not taken here", and the caller runs the scalar loop. Every form performs the same float
// operations in the same order (explicit fma, no a * b + c left to contraction), so that
// results are bit-identical across ISAs and equal to llama.cpp's
// (tests/runtime/test_attention_order). Internal linkage on purpose: each ISA's file
// compiles this with its own flags.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "runtime/runtime_kernels.h"

namespace cf::rk {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ggml's AVX-512/AVX2 expf (ggml_v_expf, the softmax's and SiLU's exp), the same float
// operations lane by lane so both engines round alike: n = round(x log2 e) by the 1.5*2^23
// trick inside one fma, a two-part Cody-Waite reduction b = x - n ln2, a degree-5
// polynomial j(b) evaluated in its fma tree, then scalef(j, n) = j * 2^n rounded once
// (here as two exact power-of-two factors); |n| > 192 gives 0 or infinity. Branch-free so
// that loops over it vectorize.
inline float fmaf_(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// Always inlined: the softmax and SiLU loops over it must vectorize.
__attribute__((always_inline)) inline float exp_inline(float x) {
  constexpr float kShift = 0x1.8p23f;
  const float z = fmaf_(x, 0x1.715476p+0f, kShift);
  const float n = z - kShift;
  const float b = fmaf_(-n, 0x1.7f7d1cp-20f, fmaf_(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = fmaf_(fmaf_(fmaf_(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf_(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                        u, fmaf_(0x1.ffffecp-1f, b, 1.0f));
  const float n_clamped = n < -192.0f ? -192.0f : (n > 192.0f ? 192.0f : n);
  const int32_t ni = static_cast<int32_t>(n_clamped);
  const int32_t n1 = ni >> 1, n2 = ni - n1;  // each in [-96, 96]: normal powers of two
  const int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  const float res = (j * s1) * s2;  // j * 2^n1 is exact; one rounding in the second product
  const bool out_of_range = (n < 0 ? -n : n) > 192.0f;
  return out_of_range ? (n <= 0 ? 0.0f : std::numeric_limits<float>::infinity()) : res;
}

// _mm512_reduce_add_ps's tree (GCC and clang alike) over 16 values: halves, quarters,
// pairs, then the last two.
inline float reduce16(const float* l) {
  const float c0 = (l[0] + l[8]) + (l[4] + l[12]), c1 = (l[1] + l[9]) + (l[5] + l[13]);
  const float c2 = (l[2] + l[10]) + (l[6] + l[14]), c3 = (l[3] + l[11]) + (l[7] + l[15]);
  return (c0 + c2) + (c1 + c3);
}

// Rounds x to the nearest f16 value (ties to even) and returns it as float, with integer
// and float operations only: GCC 12 lowers _Float16 casts to library calls unless the
// target has AVX512-FP16, and this sits in the attention's inner loops. Values beyond the
// f16 range (never seen in K, V, Q or probabilities) are not turned into infinities.
inline float round_f16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  const uint32_t a = b & 0x7fffffffu;
  // f16 normals keep 10 of float's 23 mantissa bits.
  uint32_t r = b + 0x0fffu + ((b >> 13) & 1u);
  r &= 0xffffe000u;
  float normal;
  std::memcpy(&normal, &r, sizeof normal);
  // Below 2^-14 f16 is subnormal: a fixed spacing of 2^-24.
  const float sub = __builtin_rintf(x * 16777216.0f) * (1.0f / 16777216.0f);
  return a < 0x38800000u ? sub : normal;
}

// f16 bits to float, exact (every f16 is a float). Branch-free so that loops over it
// vectorize; model/kernels.h's fp16_to_fp32 is the reference it is tested against.
// Exponent and mantissa move into float position and the exponent is rebiased by an
// integer add (inf/nan get a second add to reach 255); a subnormal is read as the normal
// 1.m * 2^-14 minus 2^-14, which is exact.
inline float f16_to_f32_scalar(uint16_t h) {
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = em & 0x0f800000u;
  const uint32_t normal = em + (112u << 23) + (exp == 0x0f800000u ? 112u << 23 : 0u);
  float sub;
  const uint32_t sub_bits = em + (113u << 23);
  std::memcpy(&sub, &sub_bits, sizeof sub);
  sub -= 0x1p-14f;
  uint32_t sub_res;
  std::memcpy(&sub_res, &sub, sizeof sub_res);
  const uint32_t bits = (exp == 0 ? sub_res : normal) | static_cast<uint32_t>(h & 0x8000u) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The ISA converts what it can (Ops::f16_to_f32_prefix), the scalar form the rest.
template <class Ops>
inline void f16_to_f32_row(const uint16_t* __restrict x, float* __restrict y, size_t n) {
  for (size_t i = Ops::f16_to_f32_prefix(x, y, n); i < n; ++i) y[i] = f16_to_f32_scalar(x[i]);
}

// One block of attention pass 1 as an ISA's score hooks see it: the task's nq queries qs
// ([nq][hd], f16-rounded) and their visible ranges qlow < pos <= qpos; the block's entries
// b0 .. b0 + bn (positions epos, padded to kBlock with "never visible"; K rows at kb,
// kv_stride apart); scores [nq][padded], scaled where visible, -inf where masked.
struct ScoreBlock {
  const float* qs;
  const int32_t* qpos;
  const int32_t* qlow;
  size_t nq;
  const int32_t* epos;
  const uint16_t* kb;
  size_t kv_stride;
  size_t b0, bn;
  float* scores;
  size_t padded;
  float scale;
  bool single;  // TileArgs::single_row_order
};

// One live block of batched pass 2: V rows at vb (kv_stride apart, bn of them), the
// probabilities [nq][padded], the P.V lanes [nq][lanes][hd]; vt: room for the block's V as
// floats (an ISA that converts it once for all queries).
struct PvBlock {
  const uint16_t* vb;
  size_t kv_stride, bn;
  size_t nq, padded, lanes;
  int hd;
  float* vt;
};

template <class D>
struct ScalarOps {
  // f16 <-> float rows and SiLU: how many leading elements the ISA did (the rest: scalar).
  static size_t f16_to_f32_prefix(const uint16_t*, float*, size_t) { return 0; }
  static size_t f32_to_f16_prefix(const float*, uint16_t*, size_t) { return 0; }
  static size_t silu_mul_prefix(float*, const float*, size_t) { return 0; }

  // The ISA's own batched tile (attention_flash.h), tried first for batched calls, and how
  // many query vectors a batched task gives it (every batched path but AMX's: kMaxQueries).
  static bool batched_tile(const TileArgs&, std::vector<float>&) { return false; }
  static constexpr size_t kBatchedTaskQueries = kMaxQueries;

  // Dot products over f16-exact values in the order of llama.cpp's CPU mul_mat (see
  // TileArgs::single_row_order): products of two f16 values are exact in float, so only
  // the grouping of the sums matters.
  //  - batched (tinyBLAS<16, __m512>): 16 lanes, lane t = fma chain over i = t (mod 16) in
  //    order, then reduce16;
  //  - single row (ggml_vec_dot_f16, AVX-512): 64 lanes over the first n & ~63 elements,
  //    folded (l[t] + l[32+t]) + (l[16+t] + l[48+t]), reduce16, then the rest added one by
  //    one in double.
  // y (a K row) is read as f16 and converted on load.
  static float dot_batched(const float* __restrict x, const uint16_t* __restrict y, int n) {
    float l[16] = {};
    for (int i = 0; i < n; i += 16) {
      float yf[16];
      f16_to_f32_row<D>(y + i, yf, 16);
      for (int t = 0; t < 16; ++t) l[t] = fmaf_(x[i + t], yf[t], l[t]);
    }
    return reduce16(l);
  }
  static float dot_single(const float* __restrict x, const uint16_t* __restrict y, int n) {
    const int main = n & ~63;
    float l[64] = {};
    for (int i = 0; i < main; i += 64) {
      float yf[64];
      f16_to_f32_row<D>(y + i, yf, 64);
      for (int t = 0; t < 64; ++t) l[t] = fmaf_(x[i + t], yf[t], l[t]);
    }
    float f[16];
    for (int t = 0; t < 16; ++t) f[t] = (l[t] + l[32 + t]) + (l[16 + t] + l[48 + t]);
    double sum = reduce16(f);
    for (int i = main; i < n; ++i) sum += static_cast<double>(x[i] * f16_to_f32_scalar(y[i]));
    return static_cast<float>(sum);
  }

  // Pass 1 of a block, whole or per query, where the ISA has a faster form of the same
  // sums: with few queries (direct), before the K block is transposed (row_major, kt free
  // as scratch), or per query on the transposed block kt [hd][kBlock] (transposed).
  template <int HD>
  static bool direct_scores(const ScoreBlock&) { return false; }
  template <int HD>
  static bool row_major_scores(const ScoreBlock&, float* /*kt*/) { return false; }
  static bool transposed_scores(const ScoreBlock&, size_t /*qi*/, const float* /*kt*/, int /*hd*/) { return false; }

  // The softmax of one query's scores s[0, n) (n a multiple of 16): lane maxima over
  // e = t (mod 16); exp(s - mx) with masked entries 0 on a prefix; the sum of reduce16 of
  // each 16 in double; s * inv rounded to f16 on a prefix.
  static void lane_max(const float* s, size_t n, float* mx_lanes) {
    for (int t = 0; t < 16; ++t) mx_lanes[t] = kNegInf;
    for (size_t e = 0; e < n; e += 16)
      for (int t = 0; t < 16; ++t) mx_lanes[t] = mx_lanes[t] > s[e + t] ? mx_lanes[t] : s[e + t];
  }
  static size_t exp_prefix(float*, size_t, float) { return 0; }
  static double sum_of_reduce16(const float* s, size_t n) {
    double sum = 0;
    for (size_t e = 0; e < n; e += 16) sum += static_cast<double>(reduce16(s + e));
    return sum;
  }
  static size_t normalize_prefix(float*, size_t, float) { return 0; }

  // Pass 2. Single row: lane t of one query over all entries into acc (p: its
  // probabilities, vh: the KV head's V column). Batched: query qi (and maybe qi + 1) of a
  // live block; returns how many queries it did.
  template <int HD>
  static bool single_lane_pv(const float*, const uint16_t*, size_t /*kv_stride*/, size_t /*n_entries*/,
                             size_t /*t*/, size_t /*lanes*/, float*) {
    return false;
  }
  template <int HD>
  static size_t block_pv(const PvBlock&, size_t /*qi*/, const float* /*p*/, float* /*q_lanes*/) { return 0; }
  // Whether block_pv needs PvBlock::vt (HD floats x kBlock on the tile's stack).
  static constexpr bool kConvertsVBlock = false;
};

}  // namespace
}  // namespace cf::rk

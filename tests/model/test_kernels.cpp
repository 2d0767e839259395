// Kernels: exact format conversions, dequantization against per-element formulas, the
// quantized GEMM against double-precision references, ISA and thread-count invariance.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "base/thread_pool.h"
#include "model/gguf.h"
#include "model/kernels.h"
#include "model/kernels_impl.h"
#include "test_support.h"

namespace cf {
namespace {

// ---------------------------------------------------------------------------------------
// fp16 / bf16

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t f16c_from_f32(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float f16c_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#endif

TEST(Fp16, EveryHalfRoundTripsAndMatchesValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f && mant != 0) {
      EXPECT_TRUE(std::isnan(f)) << h;
      continue;
    }
    // Value by definition: subnormals are mant * 2^-24, normals (1024+mant) * 2^(exp-25).
    double expect = exp == 0 ? std::ldexp(static_cast<double>(mant), -24)
                             : std::ldexp(1024.0 + mant, static_cast<int>(exp) - 25);
    if (exp == 0x1f) expect = INFINITY;
    if (h & 0x8000) expect = -expect;
    EXPECT_EQ(static_cast<double>(f), expect) << h;
    EXPECT_EQ(fp32_to_fp16(f), h) << h;
  }
}

TEST(Fp16, RoundsHalfToEvenLikeF16C) {
  std::mt19937 rng(1);
#if defined(__x86_64__)
  const bool have_f16c = __builtin_cpu_supports("f16c");
#else
  const bool have_f16c = false;
#endif
  // Ties: halfway between 1.0 and the next half (1 + 2^-10) rounds to even (1.0).
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);           // tie to even zero
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(-std::ldexp(3.0f, -25)), 0x8002);          // 1.5 ulp -> 2 (even)
  EXPECT_EQ(fp32_to_fp16(INFINITY), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(std::nanf("")) & 0x7e00, 0x7e00);
  if (!have_f16c) GTEST_SKIP() << "no F16C to compare with";
#if defined(__x86_64__)
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = rng();
    // Bias half of the samples into the half-precision range, where rounding matters.
    if (i & 1) bits = (bits & 0x807fffffu) | ((100u + bits % 50u) << 23);
    const float f = std::bit_cast<float>(bits);
    ASSERT_EQ(fp32_to_fp16(f), f16c_from_f32(f)) << std::hex << bits;
    const auto h = static_cast<uint16_t>(bits & 0xffff);
    if (((h >> 10) & 0x1f) != 0x1f) {
      ASSERT_EQ(fp16_to_fp32(h), f16c_to_f32(h)) << h;
    }
  }
#endif
}

TEST(Bf16, ConvertsByShiftingAndRoundsToEven) {
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xc000), -2.0f);
  EXPECT_EQ(kern::fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(kern::fp32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(kern::fp32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(kern::fp32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
}

// ---------------------------------------------------------------------------------------
// Random blocks with controlled scales

uint16_t h(float f) { return fp32_to_fp16(f); }
void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Fills n_blocks blocks of type t with random quants and finite scales. `extreme` mixes in
// tiny (subnormal), large and negative scales and mins.
std::vector<uint8_t> random_blocks(GgmlType t, size_t n_blocks, std::mt19937& rng, bool extreme) {
  const auto info = ggml_type_info(t);
  std::vector<uint8_t> v(n_blocks * info.block_bytes);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto scale = [&]() -> float {
    float s = 0.01f + 0.05f * std::fabs(u(rng));
    if (extreme) {
      switch (rng() % 5) {
        case 0: s = 3e-7f; break;           // fp16 subnormal
        case 1: s = 900.0f * u(rng); break;  // large, any sign
        case 2: s = -s; break;
        default: break;
      }
    }
    return s;
  };
  for (size_t i = 0; i < n_blocks; ++i) {
    uint8_t* b = v.data() + i * info.block_bytes;
    switch (t) {
      case GgmlType::F32:
        for (size_t j = 0; j < 1; ++j) {
          const float f = u(rng);
          std::memcpy(b, &f, 4);
        }
        break;
      case GgmlType::F16: put16(b, h(u(rng))); break;
      case GgmlType::BF16: put16(b, kern::fp32_to_bf16(u(rng))); break;
      case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: put16(b, h(scale())); break;
      case GgmlType::Q4_1: case GgmlType::Q5_1:
        put16(b, h(scale()));
        put16(b + 2, h(extreme ? 0.3f * u(rng) * (rng() % 3 == 0 ? 100.0f : 1.0f) : 0.02f * u(rng)));
        break;
      case GgmlType::Q4_K: case GgmlType::Q5_K:
        put16(b, h(scale()));
        put16(b + 2, h(extreme ? scale() : 0.01f * std::fabs(u(rng))));
        break;
      case GgmlType::Q6_K: put16(b + 208, h(scale())); break;
      default: break;
    }
  }
  return v;
}

// ---------------------------------------------------------------------------------------
// Per-element definitions written independently of the library's block loops.

// One 32-block of a weight row as the panel sees it: unsigned codes u and, per 16-element
// half, w = scale (u - offset) + second (second is 0 for the offset types; Q6_K's halves
// have their own scales). From the file's bytes, independently of the repacking.
struct PanelBlockParts {
  int u[32];
  float scale[2], second;
  int offset;
  bool has_min;
};
PanelBlockParts panel_parts(GgmlType t, const uint8_t* row, size_t blk) {
  auto f16 = [](const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return fp16_to_fp32(v);
  };
  PanelBlockParts p{};
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: {
      const bool has_min = t == GgmlType::Q4_1 || t == GgmlType::Q5_1;
      const bool five = t == GgmlType::Q5_0 || t == GgmlType::Q5_1;
      const uint8_t* b = row + blk * ggml_type_info(t).block_bytes;
      const uint8_t* qs = b + 2 + (has_min ? 2 : 0) + (five ? 4 : 0);
      for (int j = 0; j < 32; ++j) {
        p.u[j] = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
        if (five) p.u[j] += ((b[2 + (has_min ? 2 : 0) + j / 8] >> (j % 8)) & 1) << 4;
      }
      p.scale[0] = p.scale[1] = f16(b);
      p.second = has_min ? f16(b + 2) : 0.0f;
      p.offset = has_min ? 0 : five ? 16 : 8;
      p.has_min = has_min;
      return p;
    }
    case GgmlType::Q8_0: {
      const uint8_t* b = row + blk * 34;
      for (int j = 0; j < 32; ++j) p.u[j] = static_cast<int8_t>(b[2 + j]) + 128;
      p.scale[0] = p.scale[1] = f16(b);
      p.offset = 128;
      return p;
    }
    case GgmlType::Q4_K: case GgmlType::Q5_K: {
      const bool five = t == GgmlType::Q5_K;
      const uint8_t* b = row + (blk / 8) * (five ? 176 : 144);
      const size_t sub = blk % 8;
      const uint8_t* s = b + 4;
      int sc, mn;
      if (sub < 4) {
        sc = s[sub] % 64;
        mn = s[sub + 4] % 64;
      } else {
        sc = (s[sub + 4] % 16) + (s[sub - 4] / 64) * 16;
        mn = (s[sub + 4] / 16) + (s[sub] / 64) * 16;
      }
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int l = 0; l < 32; ++l) {
        p.u[l] = (sub % 2 == 0) ? qs[(sub / 2) * 32 + l] % 16 : qs[(sub / 2) * 32 + l] / 16;
        if (five) p.u[l] += ((b[16 + l] >> sub) & 1) * 16;
      }
      p.scale[0] = p.scale[1] = f16(b) * static_cast<float>(sc);
      p.second = -f16(b + 2) * static_cast<float>(mn);
      p.has_min = true;
      return p;
    }
    case GgmlType::Q6_K: {
      const uint8_t* b = row + (blk / 8) * 210;
      for (int e = 0; e < 32; ++e) {
        const size_t k = (blk % 8) * 32 + e, half = k / 128, w = k % 128, quarter = w / 32, l = w % 32;
        const uint8_t lb = b[half * 64 + l + (quarter % 2) * 32];
        p.u[e] = (quarter < 2 ? lb % 16 : lb / 16) + 16 * ((b[128 + half * 32 + l] >> (2 * quarter)) & 3);
        if (e % 16 == 0)
          p.scale[e / 16] = f16(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + half * 8 + quarter * 2 + l / 16]));
      }
      p.offset = 32;
      return p;
    }
    default: ADD_FAILURE() << "no panel for " << ggml_type_name(t); return p;
  }
}

float elem(GgmlType t, const uint8_t* row, size_t i) {
  auto f16 = [](const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return fp16_to_fp32(v);
  };
  switch (t) {
    case GgmlType::F32: {
      float f;
      std::memcpy(&f, row + 4 * i, 4);
      return f;
    }
    case GgmlType::F16: return f16(row + 2 * i);
    case GgmlType::BF16: {
      uint16_t v;
      std::memcpy(&v, row + 2 * i, 2);
      return std::bit_cast<float>(static_cast<uint32_t>(v) << 16);
    }
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: {
      const PanelBlockParts p = panel_parts(t, row, i / 32);
      const size_t e = i % 32;
      return p.scale[e / 16] * static_cast<float>(p.u[e] - p.offset) + p.second;
    }
    default: ADD_FAILURE() << "no formula"; return 0;
  }
}

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

TEST(Dequantize, EveryTypeMatchesPerElementFormula) {
  std::mt19937 rng(7);
  for (GgmlType t : kAllTypes) {
    for (bool extreme : {false, true}) {
      const size_t n = 512;  // two K-quant super-blocks, sixteen 32-blocks
      const auto info = ggml_type_info(t);
      const auto data = random_blocks(t, n / info.block_elems, rng, extreme);
      std::vector<float> out(n);
      dequantize_row(t, data.data(), out.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const float e = elem(t, data.data(), i);
        // The library may evaluate d*sc*q in another association; allow 2 ulps.
        ASSERT_NEAR(out[i], e, std::fabs(e) * 3e-7f + 1e-30f) << info.name << " elem " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Activation quantization

// The kernel table of one ISA (each test checks that it is available first).
const kern::IsaKernels& isa_kernels(Isa isa) {
  return kern::isa_kernels_for(isa);
}

TEST(Quantize, Q8MatchesLlamaCppRuleOnEveryIsa) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t cols = 1536, nb = cols / 32;
  std::vector<float> x(cols);
  for (auto& v : x) v = nd(rng);
  for (size_t i = 0; i < 32; ++i) x[i] = 0.0f;                     // an all-zero block
  for (size_t i = 32; i < 64; ++i) x[i] = (static_cast<float>(i) - 48.0f) * 0.5f;  // ties
  std::vector<uint8_t> want(kern::act_row_stride(nb)), got(want.size());
  // Reference by the rule: id = 127/amax, q = round-half-even(x*id), d = fp16(amax/127);
  // s16 = fp16(d_unrounded * sum q) (llama.cpp's Q8_1 s), corr = -128 * group sums.
  int8_t* wq = reinterpret_cast<int8_t*>(want.data());
  float* dv = reinterpret_cast<float*>(want.data() + nb * 32);
  for (size_t b = 0; b < nb; ++b) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    int sum = 0, group_sum[8] = {};
    for (size_t j = 0; j < 32; ++j) {
      wq[b * 32 + j] = static_cast<int8_t>(std::nearbyint(x[b * 32 + j] * id));
      sum += wq[b * 32 + j];
      group_sum[j / 4] += wq[b * 32 + j];
    }
    const float d = amax / 127.0f;
    dv[b] = fp16_to_fp32(fp32_to_fp16(d));
    dv[nb + b] = fp16_to_fp32(fp32_to_fp16(d * static_cast<float>(sum)));
    for (int g = 0; g < 8; ++g) reinterpret_cast<int32_t*>(dv + 2 * nb)[8 * b + g] = -128 * group_sum[g];
  }
  EXPECT_EQ(wq[32 + 1], -std::lround(127.0f * 15.0f / 16.0f));
  for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512}) {
    if (isa > detect_isa()) continue;
    const auto& k = isa_kernels(isa);
    std::fill(got.begin(), got.end(), 0);
    k.quantize_q8(x.data(), cols, got.data());
    const size_t record = nb * (32 + 8 + 32);  // qs, d, s16, the 8 corrections
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), record)) << isa_name(isa);
  }
}

// The Q8_K records of the K-quant kernels: every ISA writes quantize_q8_k_record's bytes,
// including the cases where the rule is subtle (the first value of largest magnitude sets
// the scale's sign; an all-zero super-block; exact halves round to even).
TEST(Quantize, Q8KRecordSameOnEveryIsa) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t cols = 1024, nb = cols / 32;
  std::vector<float> x(cols);
  for (auto& v : x) v = nd(rng);
  for (size_t i = 256; i < 512; ++i) x[i] = 0.0f;  // an all-zero super-block
  x[600] = -9.0f;                                    // ties in magnitude: the first, negative, wins
  x[700] = 9.0f;
  x[800] = 4.0f;                                     // x * 127/4 with exact halves
  for (size_t i = 801; i < 1024; ++i) x[i] = static_cast<float>(static_cast<int>(i % 9) - 4) * (2.0f / 127.0f);
  std::vector<uint8_t> want(kern::q8k_act_row_stride(nb)), got(want.size());
  kern::quantize_q8_k_record(x.data(), cols, want.data());
  const kern::ActView a{want.data(), 0, nb};
  EXPECT_EQ(a.kd(0)[1], 0.0f);
  EXPECT_FLOAT_EQ(a.kd(0)[2], 9.0f / 127.0f);  // d = 1 / iscale = max / -127 with max = -9: positive here
  for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512}) {
    if (isa > detect_isa()) continue;
    const auto& k = isa_kernels(isa);
    std::fill(got.begin(), got.end(), 0xAB);
    k.quantize_q8_k(x.data(), cols, got.data());
    const size_t record = nb * 32 + nb / 8 * 4 + 2 * nb * 4;  // qs, d per 256, bs16 per 16
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), record)) << isa_name(isa);
  }
}

// ---------------------------------------------------------------------------------------
// Matrix multiply

struct Case {
  GgmlType type;
  size_t rows, cols;
};

std::vector<float> random_acts(size_t n, size_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n * cols);
  for (auto& v : x) v = nd(rng);
  // A few outliers, as real activations have.
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 20.0f;
  return x;
}

// Whether WeightMatrix multiplies type t with per-32 8-bit activations (its block tiles;
// K super-tiles use Q8_K like the generic path, F16/BF16 tiles rounded floats).
bool int8_tiles(GgmlType t, size_t cols) {
  const auto layout = kern::tile_layout_for(static_cast<uint32_t>(t), cols);
  return layout == kern::TileLayout::Nib || layout == kern::TileLayout::Byte16;
}

// Whether WeightMatrix takes the panel GEMM (model/kernels_panel.h) for n activation rows
// in its default order: block-quantized tiles from 8 rows on.
bool takes_panel(GgmlType t, size_t cols, size_t n) {
  const auto layout = kern::tile_layout_for(static_cast<uint32_t>(t), cols);
  return n >= 8 && (layout == kern::TileLayout::Nib || layout == kern::TileLayout::Byte16 ||
                    layout == kern::TileLayout::KSuper);
}

// The panel GEMM's activation rule, written here on its own: per 32-block dx = amax / 127
// (a float, not rounded to fp16), q = round-half-even(x * 127 / amax).
struct PanelActs {
  std::vector<int8_t> q;
  std::vector<float> dx;
};
PanelActs panel_acts(const float* x, size_t cols) {
  PanelActs a{std::vector<int8_t>(cols), std::vector<float>(cols / 32)};
  for (size_t b = 0; b < cols / 32; ++b) {
    float amax = 0;
    for (size_t k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[32 * b + k]));
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    for (size_t k = 0; k < 32; ++k) a.q[32 * b + k] = static_cast<int8_t>(std::nearbyint(x[32 * b + k] * id));
    a.dx[b] = amax / 127.0f;
  }
  return a;
}

// The panel order (model/kernels_panel.h), from the file's blocks: per block the exact
// integer sums (per half for Q6_K), acc = fma(float(i), scale * dx, acc), the min types
// then acc = fma(second, dx * sum q, acc). Every ISA must match it bit for bit.
float panel_order_dot(GgmlType t, const uint8_t* w_row, const float* x, size_t cols) {
  const PanelActs a = panel_acts(x, cols);
  float acc = 0;
  for (size_t b = 0; b < cols / 32; ++b) {
    const PanelBlockParts p = panel_parts(t, w_row, b);
    int32_t i[2] = {0, 0}, sq[2] = {0, 0};
    for (int e = 0; e < 32; ++e) {
      i[e / 16] += (p.u[e] - p.offset) * a.q[32 * b + e];
      sq[e / 16] += a.q[32 * b + e];
    }
    if (t == GgmlType::Q6_K) {
      acc = std::fma(static_cast<float>(i[0]), p.scale[0] * a.dx[b], acc);
      acc = std::fma(static_cast<float>(i[1]), p.scale[1] * a.dx[b], acc);
    } else {
      acc = std::fma(static_cast<float>(i[0] + i[1]), p.scale[0] * a.dx[b], acc);
      if (p.has_min) acc = std::fma(p.second, a.dx[b] * static_cast<float>(sq[0] + sq[1]), acc);
    }
  }
  return acc;
}

// The activations as the kernel sees them: quantized then dequantized (double). Repacked
// types (WeightMatrix) quantize them per 32 elements (Q8_0's rule) whatever the weight
// type; the generic vec-dot path uses the type's own vec-dot type (Q8_K for K-quants).
std::vector<double> requantized_acts(GgmlType t, const float* x, size_t cols, bool generic_path = false,
                                     bool panel = false) {
  if (panel) {
    const PanelActs a = panel_acts(x, cols);
    std::vector<double> out(cols);
    for (size_t i = 0; i < cols; ++i) out[i] = static_cast<double>(a.q[i]) * a.dx[i / 32];
    return out;
  }
  const GgmlType act_as = !generic_path && int8_tiles(t, cols) ? GgmlType::Q8_0 : t;
  std::vector<uint8_t> rec(kern::generic_act_row_bytes(static_cast<uint32_t>(act_as), cols));
  kern::generic_quantize_row(static_cast<uint32_t>(act_as), x, cols, rec.data());
  std::vector<double> out(cols);
  switch (act_as) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0: {
      const kern::ActView a{rec.data(), 0, cols / 32};
      for (size_t i = 0; i < cols; ++i) out[i] = static_cast<double>(a.qs(0)[i]) * a.d(0)[i / 32];
      break;
    }
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: {
      const auto* q = reinterpret_cast<const int8_t*>(rec.data());
      const auto* d = reinterpret_cast<const float*>(rec.data() + cols);
      for (size_t i = 0; i < cols; ++i) out[i] = static_cast<double>(q[i]) * d[i / 256];
      break;
    }
    case GgmlType::F16:
      for (size_t i = 0; i < cols; ++i) out[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
      break;
    case GgmlType::BF16:
      for (size_t i = 0; i < cols; ++i) out[i] = bf16_to_fp32(kern::fp32_to_bf16(x[i]));
      break;
    default:
      for (size_t i = 0; i < cols; ++i) out[i] = x[i];
  }
  return out;
}

// Checks one product against double references: tight against the quantized
// activations, loose against the original ones.
void check_product(GgmlType t, const std::vector<uint8_t>& wdata, size_t rows, size_t cols,
                   const std::vector<float>& x, size_t n, const std::vector<float>& y, const char* label,
                   bool generic_path = false) {
  std::vector<float> wrow(cols);
  const size_t rb = ggml_row_bytes(t, cols);
  for (size_t o = 0; o < rows; ++o) {
    dequantize_row(t, wdata.data() + o * rb, wrow.data(), cols);
    double wnorm = 0;
    for (float v : wrow) wnorm += static_cast<double>(v) * v;
    wnorm = std::sqrt(wnorm);
    for (size_t r = 0; r < n; ++r) {
      const float* xr = x.data() + r * cols;
      const bool panel = !generic_path && takes_panel(t, cols, n);
      const auto xq = requantized_acts(t, xr, cols, generic_path, panel);
      double exact_q = 0, exact = 0, mag = 0, xnorm = 0;
      for (size_t k = 0; k < cols; ++k) {
        exact_q += wrow[k] * xq[k];
        exact += static_cast<double>(wrow[k]) * xr[k];
        mag += std::fabs(wrow[k] * xq[k]);
        xnorm += static_cast<double>(xr[k]) * xr[k];
      }
      xnorm = std::sqrt(xnorm);
      const double got = y[r * rows + o];
      // Float rounding only, except that Q8_1's s = fp16(d * sum q) carries a relative
      // 2^-11 rounding (Q4_1, Q5_1), and K-quants subtract two float terms that may nearly
      // cancel.
      const bool has_min = t == GgmlType::Q4_1 || t == GgmlType::Q5_1;
      const bool k_quant = t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
      const double rel = panel ? (has_min || k_quant ? 1e-4 : 1e-5) : has_min ? 1e-3 : k_quant ? 1e-4 : 1e-5;
      ASSERT_NEAR(got, exact_q, rel * mag + 1e-6) << label << " o=" << o << " r=" << r;
      ASSERT_NEAR(got, exact, 0.03 * wnorm * xnorm + 1e-6) << label << " o=" << o << " r=" << r;
    }
  }
}

std::vector<Isa> available_isas() {
  std::vector<Isa> v{Isa::Portable};
  if (detect_isa() >= Isa::Avx2) v.push_back(Isa::Avx2);
  if (detect_isa() >= Isa::Avx512) v.push_back(Isa::Avx512);
  return v;
}

class IsaGuard {
 public:
  explicit IsaGuard(Isa isa) { force_isa(isa); }
  ~IsaGuard() { force_isa(detect_isa()); }
};

TEST(Multiply, EveryTypeMatchesDoubleReference) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const Case cases[] = {
      {GgmlType::Q4_1, 200, 576}, {GgmlType::Q4_1, 48, 1536}, {GgmlType::Q8_0, 200, 576},
      {GgmlType::Q8_0, 33, 64},   {GgmlType::Q4_0, 40, 576},  {GgmlType::Q5_0, 40, 576},
      {GgmlType::Q5_1, 40, 576},  {GgmlType::Q4_K, 40, 512},  {GgmlType::Q5_K, 40, 768},
      {GgmlType::Q6_K, 40, 512},  {GgmlType::F16, 20, 96},    {GgmlType::BF16, 20, 96},
      {GgmlType::F16, 20, 100},   {GgmlType::BF16, 20, 100},  // not whole 32-blocks: generic path
      {GgmlType::F32, 20, 96},
  };
  for (const Case& c : cases) {
    const auto info = ggml_type_info(c.type);
    const auto w = random_blocks(c.type, c.rows * c.cols / info.block_elems, rng, false);
    WeightMatrix m(c.type, w.data(), c.rows, c.cols);
    for (size_t n : {1, 3, 17}) {
      const auto x = random_acts(n, c.cols, rng);
      for (Isa isa : available_isas()) {
        IsaGuard g(isa);
        std::vector<float> y(n * c.rows, NAN);
        m.multiply(x.data(), n, c.cols, y.data(), c.rows, pool);
        const std::string label = std::string(info.name) + " " + isa_name(isa) + " n=" + std::to_string(n);
        check_product(c.type, w, c.rows, c.cols, x, n, y, label.c_str());
      }
    }
  }
}

// The generic vec-dot path (the reference kernels, one row at a time, each type with its
// own vec-dot activation type as llama.cpp) against the same double reference.
TEST(Multiply, GenericDotMatchesDoubleReference) {
  std::mt19937 rng(16);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K,
                     GgmlType::Q5_K, GgmlType::Q6_K}) {
    const size_t rows = 9, cols = 512, n = 3;
    const auto w = random_blocks(t, rows * cols / ggml_type_info(t).block_elems, rng, false);
    const auto x = random_acts(n, cols, rng);
    const auto tid = static_cast<uint32_t>(t);
    std::vector<float> y(n * rows);
    std::vector<uint8_t> rec(kern::generic_act_row_bytes(tid, cols));
    for (size_t r = 0; r < n; ++r) {
      kern::generic_quantize_row(tid, &x[r * cols], cols, rec.data());
      for (size_t o = 0; o < rows; ++o)
        y[r * rows + o] = kern::generic_dot(tid, w.data() + o * ggml_row_bytes(t, cols), rec.data(), cols);
    }
    check_product(t, w, rows, cols, x, n, y, (std::string(ggml_type_name(t)) + " generic").c_str(), true);
  }
}

TEST(Multiply, ExtremeScalesStayAccurate) {
  std::mt19937 rng(12);
  ThreadPool pool(1);
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_1}) {
    const size_t rows = 24, cols = 512;
    const auto w = random_blocks(t, rows * cols / ggml_type_info(t).block_elems, rng, true);
    WeightMatrix m(t, w.data(), rows, cols);
    const auto x = random_acts(5, cols, rng);
    for (Isa isa : available_isas()) {
      IsaGuard g(isa);
      std::vector<float> y(5 * rows);
      m.multiply(x.data(), 5, cols, y.data(), rows, pool);
      check_product(t, w, rows, cols, x, 5, y, (std::string(ggml_type_name(t)) + " extreme " + isa_name(isa)).c_str());
    }
  }
}

bool cpu_has_avx512bf16();
bool bf16_instruction_is_two_fmas();

// Repacked types: every ISA and thread count gives the same bits; strides, row ranges and
// the weight-row lookup agree with the plain path.
TEST(Multiply, RepackedBitIdenticalAcrossIsasThreadsAndRanges) {
  std::mt19937 rng(13);
  const bool bf16_two_fmas = bf16_instruction_is_two_fmas();
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K,
                     GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F16, GgmlType::BF16}) {
    for (const auto& [rows, cols] : {std::pair<size_t, size_t>{200, 768}, {1536, 512}, {192, 1536}}) {
      // The newer types on one shape only: the kernel family is shared (keeps ASan time sane).
      if (rows != 200 && t != GgmlType::Q4_1 && t != GgmlType::Q8_0) continue;
      const auto w = random_blocks(t, rows * cols / ggml_type_info(t).block_elems, rng, false);
      WeightMatrix m(t, w.data(), rows, cols);
      for (size_t n : {1, 3, 17, 100}) {
        const size_t x_stride = cols + 5, y_stride = rows + 3;
        const auto x = random_acts(n, x_stride, rng);
        std::vector<float> ref;
        for (Isa isa : available_isas()) {
          // The one exception to "every ISA alike": BF16 on a CPU whose vdpbf16ps is not
          // its two-fma form (kernels_impl.h, float tiles).
          if (t == GgmlType::BF16 && isa == Isa::Avx512 && cpu_has_avx512bf16() && !bf16_two_fmas) continue;
          IsaGuard g(isa);
          for (ThreadPool* pool : {&pool1, &pool2, &pool3}) {
            std::vector<float> y(n * y_stride, -7.0f);
            m.multiply(x.data(), n, x_stride, y.data(), y_stride, *pool);
            for (size_t r = 0; r < n; ++r)
              for (size_t o = rows; o < y_stride; ++o) ASSERT_EQ(y[r * y_stride + o], -7.0f) << "wrote past rows";
            if (ref.empty()) {
              ref = y;
            } else {
              ASSERT_EQ(0, std::memcmp(ref.data(), y.data(), y.size() * 4))
                  << ggml_type_name(t) << " " << isa_name(isa) << " threads=" << pool->size() << " n=" << n;
            }
          }
          // A slice of output rows writes exactly those rows, with the same values.
          std::vector<float> ys(n * y_stride, -7.0f);
          const size_t ob = 5, oe = rows - 9;
          m.multiply_rows(x.data(), n, x_stride, ys.data(), y_stride, ob, oe, pool2);
          for (size_t r = 0; r < n; ++r)
            for (size_t o = 0; o < y_stride; ++o) {
              const float want = (o >= ob && o < oe) ? ref[r * y_stride + o] : -7.0f;
              ASSERT_EQ(ys[r * y_stride + o], want) << "slice o=" << o;
            }
        }
      }
      std::vector<float> a(cols), b(cols);
      for (size_t o : {size_t{0}, size_t{17}, rows - 1}) {
        m.dequantize_weight_row(o, a.data());
        dequantize_row(t, w.data() + o * ggml_row_bytes(t, cols), b.data(), cols);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), cols * 4)) << "weight row " << o;
      }
    }
  }
}

// m x (n rows of cols) on every ISA this CPU has equals `want` bit for bit.
void expect_bitwise_on_every_isa(const WeightMatrix& m, const std::vector<float>& x, size_t n, size_t cols,
                                 const std::vector<float>& want, ThreadPool& pool, const std::string& what) {
  const size_t rows = m.rows();
  for (Isa isa : available_isas()) {
    IsaGuard g(isa);
    std::vector<float> y(n * rows);
    m.multiply(x.data(), n, cols, y.data(), rows, pool);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want[i]))
          << what << " " << isa_name(isa) << " at " << i << ": " << y[i] << " vs " << want[i];
  }
}

// llama.cpp's x86 vec-dot order for Q4_1 x Q8_1 and Q8_0 x Q8_0 (ggml_vec_dot_q4_1_q8_1,
// ggml_vec_dot_q8_0_q8_0 and tinyBLAS_Q0_AVX on an AVX2/AVX-512 build), written from the
// file's blocks: 8 float lanes, lane g = fma(dw*dx, exact dot of elements 4g..4g+3, lane g)
// per block; Q4_1 adds summ = fma(m, s, summ) per block; then hsum_float_8's tree, then
// + summ. Every ISA must reproduce it bit for bit.
float llama_order_dot(GgmlType t, const uint8_t* w_row, const float* x, size_t cols) {
  const bool q4 = t == GgmlType::Q4_1 || t == GgmlType::Q5_1;  // the types with a min
  std::vector<uint8_t> rec(kern::generic_act_row_bytes(static_cast<uint32_t>(t), cols));
  kern::generic_quantize_row(static_cast<uint32_t>(t), x, cols, rec.data());
  const kern::ActView a{rec.data(), 0, cols / 32};
  const size_t block_bytes = ggml_type_info(t).block_bytes;
  float lane[8] = {}, summ = 0.0f;
  for (size_t b = 0; b < cols / 32; ++b) {
    const uint8_t* blk = w_row + b * block_bytes;
    uint16_t dh, mh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&mh, blk + 2, 2);
    uint32_t qh;
    std::memcpy(&qh, blk + (t == GgmlType::Q5_1 ? 4 : 2), 4);
    int wq[32];
    for (int j = 0; j < 32; ++j) {
      switch (t) {
        case GgmlType::Q4_1: wq[j] = j < 16 ? blk[4 + j] & 0xF : blk[4 + j - 16] >> 4; break;
        case GgmlType::Q4_0: wq[j] = (j < 16 ? blk[2 + j] & 0xF : blk[2 + j - 16] >> 4) - 8; break;
        case GgmlType::Q5_0:
          wq[j] = ((j < 16 ? blk[6 + j] & 0xF : blk[6 + j - 16] >> 4) | (((qh >> j) & 1) << 4)) - 16;
          break;
        case GgmlType::Q5_1: wq[j] = (j < 16 ? blk[8 + j] & 0xF : blk[8 + j - 16] >> 4) | (((qh >> j) & 1) << 4); break;
        default: wq[j] = static_cast<int8_t>(blk[2 + j]); break;  // Q8_0
      }
    }
    const float dd = fp16_to_fp32(dh) * a.d(0)[b];
    for (int g = 0; g < 8; ++g) {
      int isum = 0;
      for (int j = 4 * g; j < 4 * g + 4; ++j) isum += wq[j] * a.qs(0)[32 * b + j];
      lane[g] = std::fma(dd, static_cast<float>(isum), lane[g]);
    }
    if (q4) summ = std::fma(fp16_to_fp32(mh), a.s16(0)[b], summ);
  }
  const float h4[4] = {lane[0] + lane[4], lane[1] + lane[5], lane[2] + lane[6], lane[3] + lane[7]};
  const float total = (h4[0] + h4[2]) + (h4[1] + h4[3]);
  return q4 ? total + summ : total;
}

TEST(Multiply, RepackedFollowsLlamaCppOrderExactly) {
  std::mt19937 rng(15);
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1}) {
    const size_t rows = 37, cols = 576;
    const auto w = random_blocks(t, rows * cols / 32, rng, false);
    WeightMatrix m(t, w.data(), rows, cols);
    const size_t rb = ggml_row_bytes(t, cols);
    for (size_t n : {1, 2, 5}) {
      const auto x = random_acts(n, cols, rng);
      std::vector<float> want(n * rows);
      for (size_t r = 0; r < n; ++r)
        for (size_t o = 0; o < rows; ++o) want[r * rows + o] = llama_order_dot(t, w.data() + o * rb, &x[r * cols], cols);
      expect_bitwise_on_every_isa(m, x, n, cols, want, pool, std::string(ggml_type_name(t)) + " n=" + std::to_string(n));
      if (t != GgmlType::Q4_1 && t != GgmlType::Q8_0) continue;
      // The plain (non-repacked) dot of the same weight type agrees as well.
      std::vector<uint8_t> rec(kern::generic_act_row_bytes(static_cast<uint32_t>(t), cols));
      kern::generic_quantize_row(static_cast<uint32_t>(t), x.data(), cols, rec.data());
      for (size_t o = 0; o < rows; ++o)
        ASSERT_EQ(std::bit_cast<uint32_t>(kern::generic_dot(static_cast<uint32_t>(t), w.data() + o * rb, rec.data(), cols)),
                  std::bit_cast<uint32_t>(want[o]))
            << ggml_type_name(t) << " generic dot, row " << o;
    }
  }
}

// The panel GEMM (model/kernels_panel.h) of every block-quantized type: each ISA gives the
// test's own transcription of the panel order bit for bit, from 8 rows in the default order
// and at any row count in the Batched order (a forward pass's, so that one row's result
// never depends on how many rows share the pass). Extreme activations (one outlier per
// block, all-equal blocks, zero blocks) included.
TEST(Multiply, PanelFollowsItsOrderExactly) {
  std::mt19937 rng(19);
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K,
                     GgmlType::Q5_K, GgmlType::Q6_K}) {
    const size_t rows = 37, cols = 768;
    const auto w = random_blocks(t, rows * cols / ggml_type_info(t).block_elems, rng, false);
    WeightMatrix m(t, w.data(), rows, cols);
    const size_t rb = ggml_row_bytes(t, cols);
    for (size_t n : {1, 3, 8, 13}) {
      auto x = random_acts(n, cols, rng);
      for (size_t i = 0; i < 64 && i < x.size(); ++i) x[i] = 0.0f;                  // a zero block
      for (size_t i = 64; i < 96 && i < x.size(); ++i) x[i] = -2.5f;                // all equal
      const auto order = n >= 8 ? WeightMatrix::KQuantOrder::ByRowCount : WeightMatrix::KQuantOrder::Batched;
      std::vector<float> want(n * rows);
      for (size_t r = 0; r < n; ++r)
        for (size_t o = 0; o < rows; ++o) want[r * rows + o] = panel_order_dot(t, w.data() + o * rb, &x[r * cols], cols);
      for (Isa isa : available_isas()) {
        IsaGuard g(isa);
        std::vector<float> y(n * rows);
        m.multiply(x.data(), n, cols, y.data(), rows, pool, order);
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want[i]))
              << ggml_type_name(t) << " " << isa_name(isa) << " n=" << n << " at " << i << ": " << y[i] << " vs "
              << want[i];
      }
    }
  }
}

// The AMX panel GEMM (kernels_panel_amx.cpp) is held to a tolerance, not to bits: BF16
// weights and activations, fp32 sums. Each product w x carries at most two BF16 roundings
// (relative 2^-9 each), so |y - exact| <= 2^-8 sum |w x| (+ fp32 accumulation), against
// the double product of the file's dequantized weights and the unrounded activations. It
// must also be more accurate than the 8-bit panel of the other ISAs on the same inputs
// (root-mean-square error over all outputs): the reason it is allowed to differ. Row
// counts cross the 16-row tiles, the 64-row groups and the 256-row task chunks; a row
// slice writes only its rows.
// Root-mean-square error of y against the double product; bounded: each error within the
// BF16 bound above.
double error_rms(GgmlType t, const std::vector<uint8_t>& w, size_t rows, size_t cols, const std::vector<float>& x,
                 size_t n, const std::vector<float>& y, bool bounded, const std::string& label) {
  std::vector<float> wrow(cols);
  const size_t rb = ggml_row_bytes(t, cols);
  double sq = 0;
  for (size_t o = 0; o < rows; ++o) {
    dequantize_row(t, w.data() + o * rb, wrow.data(), cols);
    for (size_t r = 0; r < n; ++r) {
      double exact = 0, mag = 0;
      for (size_t k = 0; k < cols; ++k) {
        const double p = static_cast<double>(wrow[k]) * x[r * cols + k];
        exact += p;
        mag += std::fabs(p);
      }
      const double err = y[r * rows + o] - exact;
      if (bounded) {
        EXPECT_LE(std::fabs(err), std::ldexp(mag, -8) * 1.01 + 1e-6) << label << " o=" << o << " r=" << r;
      }
      sq += err * err;
    }
  }
  return std::sqrt(sq / static_cast<double>(rows * n));
}

TEST(Multiply, AmxPanelWithinToleranceAndMoreAccurateThanInt8) {
  if (detect_isa() < Isa::Amx) GTEST_SKIP() << "AMX absent on this CPU (Kernels.AmxKernelsAreTestedOnThisCpu says so)";
  std::mt19937 rng(23);
  ThreadPool pool(2);
  struct AmxCase {
    GgmlType t;
    size_t rows, cols;
    std::vector<size_t> ns;
  };
  // 37 rows: 3 tiles, an odd pair; 600 rows: 38 tiles, more than one pass (kPassTiles) of a
  // task. Row counts: partial and whole 16-row groups, odd group counts (48, 60), the 512-row
  // task chunk crossed (600). 768 columns: 3 K slices, the last one whole; 512: 2.
  std::vector<AmxCase> cases;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K,
                     GgmlType::Q5_K, GgmlType::Q6_K})
    cases.push_back({t, 37, 768, {8, 17, 48, 60, 64, 100, 300}});
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) cases.push_back({t, 600, 512, {33, 600}});
  for (const AmxCase& k : cases) {
    const GgmlType t = k.t;
    const size_t rows = k.rows, cols = k.cols;
    const auto w = random_blocks(t, rows * cols / ggml_type_info(t).block_elems, rng, false);
    WeightMatrix m(t, w.data(), rows, cols);
    for (size_t n : k.ns) {
      const auto x = random_acts(n, cols, rng);
      const std::string label = std::string(ggml_type_name(t)) + " " + std::to_string(rows) + " rows, n=" + std::to_string(n);
      std::vector<float> amx(n * rows), int8(n * rows);
      {
        IsaGuard g(Isa::Amx);
        m.multiply(x.data(), n, cols, amx.data(), rows, pool);
      }
      {
        IsaGuard g(Isa::Avx512);
        m.multiply(x.data(), n, cols, int8.data(), rows, pool);
      }
      const double e_amx = error_rms(t, w, rows, cols, x, n, amx, true, label + " amx");
      const double e_int8 = error_rms(t, w, rows, cols, x, n, int8, false, label + " avx512");
      EXPECT_LT(e_amx, e_int8) << label;
      // A slice of output rows and strided rows: the same values, only those rows written.
      IsaGuard g(Isa::Amx);
      const size_t x_stride = cols + 5, y_stride = rows + 3, ob = 5, oe = rows - 9;  // slices cut the first and last tiles
      std::vector<float> xs(n * x_stride, 1e30f);
      for (size_t r = 0; r < n; ++r) std::copy_n(&x[r * cols], cols, &xs[r * x_stride]);
      std::vector<float> ys(n * y_stride, -7.0f);
      m.multiply_rows(xs.data(), n, x_stride, ys.data(), y_stride, ob, oe, pool);
      for (size_t r = 0; r < n; ++r)
        for (size_t o = 0; o < y_stride; ++o) {
          const float want = (o >= ob && o < oe) ? amx[r * rows + o] : -7.0f;
          ASSERT_EQ(ys[r * y_stride + o], want) << label << " slice r=" << r << " o=" << o;
        }
    }
  }
}

// A kernel that drops one block of a row (the test of the contract's teeth, issue 57): the
// tolerance above catches it. Simulated on the AMX result: the block's exact contribution
// taken out.
TEST(Multiply, AmxToleranceCatchesADroppedBlock) {
  if (detect_isa() < Isa::Amx) GTEST_SKIP() << "AMX absent on this CPU (Kernels.AmxKernelsAreTestedOnThisCpu says so)";
  std::mt19937 rng(29);
  ThreadPool pool(1);
  const GgmlType t = GgmlType::Q4_K;
  const size_t rows = 16, cols = 512, n = 16;
  const auto w = random_blocks(t, rows * cols / 256, rng, false);
  WeightMatrix m(t, w.data(), rows, cols);
  const auto x = random_acts(n, cols, rng);
  std::vector<float> y(n * rows);
  IsaGuard g(Isa::Amx);
  m.multiply(x.data(), n, cols, y.data(), rows, pool);
  std::vector<float> wrow(cols);
  size_t caught = 0;
  for (size_t o = 0; o < rows; ++o) {
    m.dequantize_weight_row(o, wrow.data());
    for (size_t r = 0; r < n; ++r) {
      double exact = 0, mag = 0, block = 0;
      for (size_t k = 0; k < cols; ++k) {
        const double p = static_cast<double>(wrow[k]) * x[r * cols + k];
        exact += p;
        mag += std::fabs(p);
        if (k >= 96 && k < 128) block += p;
      }
      const double dropped = y[r * rows + o] - block;
      caught += std::fabs(dropped - exact) > std::ldexp(mag, -8) * 1.01 + 1e-6;
    }
  }
  EXPECT_GT(caught, n * rows / 2) << "a dropped block must break the tolerance for most outputs";
}

// llama.cpp's x86 vec-dot of Q4_K/Q5_K/Q6_K with Q8_K (ggml_vec_dot_q{4,5,6}_K_q8_K, AVX2
// branch), transcribed from the file's blocks: per super-block and lane g, the exact sum
// over sub-blocks of scale * (dot of elements 4g..4g+3 of the 32-block; Q6_K's -32 offset
// as 32 * block g's scaled bsums in lane g, as llama-cpp-python 0.3.36's ggml does it),
// then lane[g] = fma(dx * d, S_g, lane[g]); Q4_K: 4 min lanes fma(-dx * dmin, m bs pairs),
// reduced (0+2)+(1+3); Q5_K: one fma(-dx * dmin, sum m bs). Every ISA must match it.
int k_scale(const uint8_t* q, int j, bool min) {
  if (j < 4) return q[j + (min ? 4 : 0)] & 63;
  return min ? (q[j + 4] >> 4) | ((q[j] >> 6) << 4) : (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
}

float llama_kquant_dot(GgmlType t, const uint8_t* w_row, const float* x, size_t cols) {
  std::vector<uint8_t> rec(kern::generic_act_row_bytes(static_cast<uint32_t>(t), cols));
  kern::generic_quantize_row(static_cast<uint32_t>(t), x, cols, rec.data());
  const size_t nsb = cols / 256;
  const auto* xq = reinterpret_cast<const int8_t*>(rec.data());
  const auto* xd = reinterpret_cast<const float*>(rec.data() + cols);
  const auto* bsums = reinterpret_cast<const int16_t*>(rec.data() + cols + nsb * 4);
  const size_t block_bytes = ggml_type_info(t).block_bytes;
  float lane[8] = {}, accm[4] = {}, summs = 0.0f;
  for (size_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = w_row + sb * block_bytes;
    int q[256], sc[16];
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32, l = e % 32;
      if (t == GgmlType::Q6_K) {
        const int half = e / 128, quarter = e % 128 / 32;
        const uint8_t lo = blk[64 * half + (quarter & 1) * 32 + l];
        q[e] = (quarter < 2 ? lo & 0xF : lo >> 4) | (((blk[128 + 32 * half + l] >> (2 * quarter)) & 3) << 4);
      } else {
        const uint8_t lo = blk[(t == GgmlType::Q5_K ? 48 : 16) + 32 * (j / 2) + l];
        q[e] = ((j & 1) ? lo >> 4 : lo & 0xF) + (t == GgmlType::Q5_K && ((blk[16 + l] >> j) & 1) ? 16 : 0);
      }
    }
    for (int i = 0; i < 16; ++i)
      sc[i] = t == GgmlType::Q6_K ? static_cast<int8_t>(blk[192 + i]) : k_scale(blk + 4, i / 2, false);
    int S[8] = {};
    for (int e = 0; e < 256; ++e) S[e % 32 / 4] += sc[e / 16] * q[e] * xq[sb * 256 + e];
    if (t == GgmlType::Q6_K)  // q - 32: the offset subtracted per lane g from block g's sums
      for (int g = 0; g < 8; ++g)
        S[g] -= 32 * (sc[2 * g] * bsums[sb * 16 + 2 * g] + sc[2 * g + 1] * bsums[sb * 16 + 2 * g + 1]);
    uint16_t dh, dminh;
    std::memcpy(&dh, blk + (t == GgmlType::Q6_K ? 208 : 0), 2);
    std::memcpy(&dminh, blk + 2, 2);
    int mb[8] = {};
    if (t != GgmlType::Q6_K)
      for (int j = 0; j < 8; ++j) mb[j] = k_scale(blk + 4, j, true) * (bsums[sb * 16 + 2 * j] + bsums[sb * 16 + 2 * j + 1]);
    const float d = xd[sb] * fp16_to_fp32(dh);
    for (int g = 0; g < 8; ++g) lane[g] = std::fma(d, static_cast<float>(S[g]), lane[g]);
    if (t == GgmlType::Q6_K) continue;
    const float dmin = -xd[sb] * fp16_to_fp32(dminh);
    if (t == GgmlType::Q4_K) {
      for (int i = 0; i < 4; ++i) accm[i] = std::fma(dmin, static_cast<float>(mb[2 * i] + mb[2 * i + 1]), accm[i]);
    } else {
      summs = std::fma(dmin, static_cast<float>(mb[0] + mb[1] + mb[2] + mb[3] + mb[4] + mb[5] + mb[6] + mb[7]), summs);
    }
  }
  const float h4[4] = {lane[0] + lane[4], lane[1] + lane[5], lane[2] + lane[6], lane[3] + lane[7]};
  const float total = (h4[0] + h4[2]) + (h4[1] + h4[3]);
  if (t == GgmlType::Q4_K) return total + ((accm[0] + accm[2]) + (accm[1] + accm[3]));
  return t == GgmlType::Q5_K ? total + summs : total;
}

TEST(Multiply, KQuantsFollowLlamaCppOrderExactly) {
  std::mt19937 rng(17);
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const size_t rows = 37, cols = 768;
    const auto w = random_blocks(t, rows * cols / 256, rng, false);
    WeightMatrix m(t, w.data(), rows, cols);
    const size_t rb = ggml_row_bytes(t, cols);
    for (size_t n : {1, 2, 5, 8, 11}) {  // below 8 rows llama.cpp's vec-dot, from 8 the panel GEMM
      const auto x = random_acts(n, cols, rng);
      std::vector<float> want(n * rows);
      for (size_t r = 0; r < n; ++r)
        for (size_t o = 0; o < rows; ++o)
          want[r * rows + o] = n >= 8 ? panel_order_dot(t, w.data() + o * rb, &x[r * cols], cols)
                                      : llama_kquant_dot(t, w.data() + o * rb, &x[r * cols], cols);
      expect_bitwise_on_every_isa(m, x, n, cols, want, pool, std::string(ggml_type_name(t)) + " n=" + std::to_string(n));
    }
  }
}

// Integer sums at their extremes: weights at their largest quant against activations that
// quantize to -127 or 127, which random quants never reach. The AVX2 panel kernel's
// vpmaddubsw pairs (2 x 63 x 127 for Q6_K) must not saturate, and the decode vec-dot sums
// its min and offset terms on int16 pairs of the activation sums (kpairs).
TEST(Multiply, KQuantsExactAtExtremeQuants) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const size_t rows = 24, cols = 512;
    auto w = random_blocks(t, rows * cols / 256, rng, false);
    const size_t bb = ggml_type_info(t).block_bytes;
    for (size_t b = 0; b < w.size() / bb; ++b) {
      uint8_t* blk = w.data() + b * bb;
      // Every quant at its maximum (15 / 31 / 63): the value bytes all ones.
      if (t == GgmlType::Q6_K) std::memset(blk, 0xFF, 128 + 64);         // ql, qh
      else if (t == GgmlType::Q5_K) std::memset(blk + 16, 0xFF, 32 + 128);  // qh, qs
      else std::memset(blk + 16, 0xFF, 128);                               // qs
    }
    WeightMatrix m(t, w.data(), rows, cols);
    const size_t rb = ggml_row_bytes(t, cols);
    // Q8_K's rule (q = min(127, round(-127 x / max)), max: the first value of largest |x|):
    // equal values all quantize to -127; -0.999 after a leading 1 in each super-block to 127.
    for (size_t n : {1, 9})  // the decode vec-dot and the panel GEMM
    for (bool to_127 : {false, true}) {
      std::vector<float> x(n * cols, to_127 ? -0.999f : 1.0f);
      if (to_127)
        for (size_t i = 0; i < x.size(); i += 256) x[i] = 1.0f;
      std::vector<float> want(n * rows);
      for (size_t r = 0; r < n; ++r)
        for (size_t o = 0; o < rows; ++o)
          want[r * rows + o] = n >= 8 ? panel_order_dot(t, w.data() + o * rb, &x[r * cols], cols)
                                      : llama_kquant_dot(t, w.data() + o * rb, &x[r * cols], cols);
      expect_bitwise_on_every_isa(m, x, n, cols, want, pool,
                                  std::string(ggml_type_name(t)) + (to_127 ? " 127" : " -127") + " n=" + std::to_string(n));
    }
  }
}

// vdpbf16ps on this CPU (the caller checks it has it): acc[l] += a[2l+1] b[2l+1], then
// + a[2l] b[2l].
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bf16"))) void dpbf16_hw(float* acc, const uint16_t* a, const uint16_t* b) {
  __m512i va, vb;
  std::memcpy(&va, a, 64);
  std::memcpy(&vb, b, 64);
  _mm512_storeu_ps(acc, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)va, (__m512bh)vb));
}
bool cpu_has_avx512bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}
#else
void dpbf16_hw(float*, const uint16_t*, const uint16_t*) {}
bool cpu_has_avx512bf16() { return false; }
#endif

// llama.cpp's F16/BF16 x F32 order (llama-cpp-python 0.3.36, AVX-512 + AVX512-BF16 build,
// read from its libggml-cpu.so), transcribed from the file's rows: the activations rounded
// to the weight's type; from 2 rows on (matrix rows a multiple of 4) tinyBLAS: one 16-lane
// accumulator per output, F16 lane k % 16 += w x (fma), BF16 lane l of each 32-block +=
// words 2l+1 then 2l (vdpbf16ps), then _mm512_reduce_add_ps's tree; otherwise
// ggml_vec_dot_f16 (4 accumulators per 64 k, (a0 + a2) + (a1 + a3), reduced) or
// ggml_vec_dot_bf16 (2 accumulators per 64 k, each reduced, summed in double), k past the
// last 64 as float products in double. Every ISA must match it.
float reduce_add_16(const float* l) {
  float v[16];
  std::memcpy(v, l, sizeof v);
  for (int s = 8; s > 0; s /= 2)
    for (int i = 0; i < s; ++i) v[i] += v[i + s];
  return v[0];
}

// hw_dp: the BF16 step by this CPU's vdpbf16ps (what llama.cpp runs here, and the AVX-512
// kernels where the CPU has it), else by its documented two-fma form.
float llama_half_order_dot(GgmlType t, const uint8_t* w_row, const float* x_in, size_t cols, bool tinyblas,
                           bool hw_dp = false) {
  const bool bf = t == GgmlType::BF16;
  std::vector<float> w(cols), x(cols);
  for (size_t k = 0; k < cols; ++k) {
    w[k] = elem(t, w_row, k);
    x[k] = bf ? std::bit_cast<float>(static_cast<uint32_t>(kern::fp32_to_bf16(x_in[k])) << 16) : fp16_to_fp32(h(x_in[k]));
  }
  float acc[4][16] = {};
  auto dp_step = [&](float& lane, size_t k) {  // words k, k + 1 (k even)
    if (hw_dp) {
      uint16_t a[32] = {kern::fp32_to_bf16(w[k]), kern::fp32_to_bf16(w[k + 1])};
      uint16_t b[32] = {kern::fp32_to_bf16(x[k]), kern::fp32_to_bf16(x[k + 1])};
      float acc16[16] = {lane};
      dpbf16_hw(acc16, a, b);
      lane = acc16[0];
      return;
    }
    lane = std::fma(w[k + 1], x[k + 1], lane);
    lane = std::fma(w[k], x[k], lane);
  };
  if (tinyblas) {
    for (size_t k = 0; k < cols; k += bf ? 2 : 1) {
      if (bf) dp_step(acc[0][k % 32 / 2], k);
      else acc[0][k % 16] = std::fma(w[k], x[k], acc[0][k % 16]);
    }
    return reduce_add_16(acc[0]);
  }
  const size_t n64 = cols / 64 * 64;
  double sum = 0.0;
  if (bf) {
    for (size_t k = 0; k < n64; k += 2) dp_step(acc[k / 32 % 2][k % 32 / 2], k);
    sum += reduce_add_16(acc[0]);
    sum += reduce_add_16(acc[1]);
  } else {
    for (size_t k = 0; k < n64; ++k) acc[k / 16 % 4][k % 16] = std::fma(w[k], x[k], acc[k / 16 % 4][k % 16]);
    for (int l = 0; l < 16; ++l) acc[0][l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    sum = reduce_add_16(acc[0]);
  }
  for (size_t k = n64; k < cols; ++k) sum += static_cast<double>(w[k] * x[k]);
  return static_cast<float>(sum);
}

TEST(Multiply, HalfFollowsLlamaCppOrderExactly) {
  std::mt19937 rng(19);
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16}) {
    // 576: whole 64s; 608: an odd 32-block (the vec-dot's scalar tail); 37 rows: not a
    // multiple of 4, so llama.cpp keeps its vec-dot at every n.
    for (const auto& [rows, cols] : {std::pair<size_t, size_t>{40, 576}, {36, 608}, {37, 576}}) {
      const auto w = random_blocks(t, rows * cols, rng, false);
      WeightMatrix m(t, w.data(), rows, cols);
      const size_t rb = ggml_row_bytes(t, cols);
      for (size_t n : {1, 2, 5, 9}) {
        const auto x = random_acts(n, cols, rng);
        const bool tinyblas = n >= 2 && rows % 4 == 0;
        std::vector<float> want_fma(n * rows), want_hw(n * rows);
        for (size_t r = 0; r < n; ++r)
          for (size_t o = 0; o < rows; ++o) {
            want_fma[r * rows + o] = llama_half_order_dot(t, w.data() + o * rb, &x[r * cols], cols, tinyblas);
            if (t == GgmlType::BF16 && cpu_has_avx512bf16())
              want_hw[r * rows + o] = llama_half_order_dot(t, w.data() + o * rb, &x[r * cols], cols, tinyblas, true);
          }
        for (Isa isa : available_isas()) {
          IsaGuard g(isa);
          // AVX-512 BF16 runs vdpbf16ps where the CPU has it (its GEMM the two-fma form only
          // where that is the same), the other ISAs the two-fma form.
          const bool hw = t == GgmlType::BF16 && isa == Isa::Avx512 && cpu_has_avx512bf16();
          const std::vector<float>& want = hw ? want_hw : want_fma;
          for (auto order : {WeightMatrix::KQuantOrder::ByRowCount,
                             tinyblas ? WeightMatrix::KQuantOrder::Batched : WeightMatrix::KQuantOrder::ByRowCount}) {
            std::vector<float> y(n * rows);
            m.multiply(x.data(), n, cols, y.data(), rows, pool, order);
            for (size_t i = 0; i < y.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want[i]))
                  << ggml_type_name(t) << " " << isa_name(isa) << " " << rows << "x" << cols << " n=" << n << " at " << i
                  << ": " << y[i] << " vs " << want[i];
          }
        }
        if (n != 2 || rows % 4 != 0) continue;
        // PerRow asks for the vec-dot order at any n (active ISA: the best one).
        const bool hw = t == GgmlType::BF16 && active_isa() == Isa::Avx512 && cpu_has_avx512bf16();
        auto want_vecdot = [&](size_t o, size_t r) {
          return llama_half_order_dot(t, w.data() + o * rb, &x[r * cols], cols, false, hw);
        };
        std::vector<float> y(n * rows);
        m.multiply(x.data(), n, cols, y.data(), rows, pool, WeightMatrix::KQuantOrder::PerRow);
        for (size_t r = 0; r < n; ++r)
          for (size_t o = 0; o < rows; ++o)
            ASSERT_EQ(std::bit_cast<uint32_t>(y[r * rows + o]),
                      std::bit_cast<uint32_t>(want_vecdot(o, r)));
      }
    }
  }
}

// The BF16 order's step as kernels_impl.h documents it: vdpbf16ps is two fmas, the odd
// words' product first (so on this Xeon). Checked on random lanes; false at the first lane
// that differs, or without the instruction.
bool bf16_instruction_is_two_fmas() {
  if (!cpu_has_avx512bf16()) return false;
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int it = 0; it < 20000; ++it) {
    uint16_t a[32], b[32];
    float acc[16], want[16];
    for (int i = 0; i < 32; ++i) {
      a[i] = kern::fp32_to_bf16(nd(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10));
      b[i] = kern::fp32_to_bf16(nd(rng));
    }
    for (int l = 0; l < 16; ++l) {
      acc[l] = nd(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
      want[l] = std::fma(bf16_to_fp32(a[2 * l]), bf16_to_fp32(b[2 * l]),
                         std::fma(bf16_to_fp32(a[2 * l + 1]), bf16_to_fp32(b[2 * l + 1]), acc[l]));
    }
    dpbf16_hw(acc, a, b);
    for (int l = 0; l < 16; ++l)
      if (std::bit_cast<uint32_t>(acc[l]) != std::bit_cast<uint32_t>(want[l])) return false;
  }
  return true;
}

// The float tiles' activation rows (F16: rounded through fp16; BF16: through bf16, in
// bf16_act_pos order) are the portable rule's bits on every ISA, specials included.
TEST(Quantize, FloatTileActivationsSameOnEveryIsa) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t cols = 512;
  std::vector<float> x(cols);
  for (size_t i = 0; i < cols; ++i) x[i] = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xff812345u),
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            65504.0f, 65520.0f, -65536.0f, 3e-7f, -6e-8f, 1e-40f, 0.0f, -0.0f,
                            1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -(1.0f + 0x1p-8f),
                            std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()};
  for (size_t i = 0; i < std::size(specials); ++i) x[7 * i + 3] = specials[i];
  std::vector<float> want(cols), got(cols);
  for (bool bf : {false, true}) {
    (bf ? kern::round_bf16_row : kern::round_f16_row)(x.data(), cols, want.data());
    for (Isa isa : available_isas()) {
      const kern::IsaKernels& k = kern::isa_kernels_for(isa);
      std::fill(got.begin(), got.end(), -7.0f);
      (bf ? k.round_bf16 : k.round_f16)(x.data(), cols, got.data());
      for (size_t i = 0; i < cols; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
            << (bf ? "BF16 " : "F16 ") << isa_name(isa) << " at " << i;
    }
  }
}

TEST(Multiply, GenericPathIsThreadCountInvariant) {
  std::mt19937 rng(14);
  ThreadPool pool1(1), pool3(3);
  const size_t rows = 70, cols = 500, n = 9;  // F16 rows of 500: not tiled
  const auto w = random_blocks(GgmlType::F16, rows * cols, rng, false);
  WeightMatrix m(GgmlType::F16, w.data(), rows, cols);
  const auto x = random_acts(n, cols, rng);
  std::vector<float> y1(n * rows), y3(n * rows);
  m.multiply(x.data(), n, cols, y1.data(), rows, pool1);
  m.multiply(x.data(), n, cols, y3.data(), rows, pool3);
  EXPECT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * 4));
}

TEST(Multiply, RejectsBadShapes) {
  std::vector<uint8_t> w(1024);
  EXPECT_THROW(WeightMatrix(GgmlType::Q4_1, w.data(), 2, 48), std::invalid_argument);
  EXPECT_THROW(WeightMatrix(GgmlType::Q4_K, w.data(), 1, 128), std::invalid_argument);
  EXPECT_THROW(WeightMatrix(GgmlType::Q8_K, w.data(), 1, 256), std::invalid_argument);
}

// The real model's first attention matrix: repacked GEMM vs the dequantized weights.
TEST(Multiply, RealModelAttnQ) {
  CF_REQUIRE_MODEL();
  auto file = GgufFile::open(test::default_model_path());
  const GgufTensor& t = file->tensor("blk.0.attn_q.weight");
  ASSERT_EQ(t.type, GgmlType::Q4_1);
  const size_t cols = t.dims[0], rows = t.rows();
  // Keep a copy: the matrix releases the mapped pages it no longer needs.
  std::vector<uint8_t> w(t.data, t.data + t.n_bytes);
  WeightMatrix m(t.type, t.data, rows, cols);
  std::mt19937 rng(5);
  const size_t n = 7;
  const auto x = random_acts(n, cols, rng);
  ThreadPool pool(2);
  std::vector<float> y(n * rows);
  m.multiply(x.data(), n, cols, y.data(), rows, pool);
  check_product(t.type, w, rows, cols, x, n, y, "attn_q");
  // The mapping still reads back correctly after the release (pages come from the file).
  EXPECT_EQ(0, std::memcmp(w.data(), t.data, t.n_bytes));
}

// Resident kB of the mapping that contains `p` (from /proc/self/smaps).
long mapping_rss_kb(const void* p) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  bool inside = false;
  long rss = -1;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
      inside = addr >= lo && addr < hi;
      continue;
    }
    if (inside && std::sscanf(line, "Rss: %ld kB", &rss) == 1) break;
  }
  std::fclose(f);
  return rss;
}

// After repacking, the mapped file pages of the tensor are released (resident memory
// stays near the file size instead of doubling).
TEST(Multiply, RepackReleasesMappedPages) {
  CF_REQUIRE_MODEL();
  auto file = GgufFile::open(test::default_model_path());
  const GgufTensor& t = file->tensor("token_embd.weight");
  ASSERT_EQ(t.type, GgmlType::Q8_0);
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < t.n_bytes; i += 4096) sink = sink + t.data[i];  // fault every page in
  const long before = mapping_rss_kb(t.data);
  ASSERT_GT(before, static_cast<long>(t.n_bytes / 1024) - 8);
  WeightMatrix m(t.type, t.data, t.rows(), t.dims[0]);
  const long after = mapping_rss_kb(t.data);
  EXPECT_LT(after, before - static_cast<long>(t.n_bytes / 1024) + 16) << "before " << before << " kB";
  // The embedding lookup reads the repacked copy and matches the file's rows.
  std::vector<float> a(t.dims[0]), b(t.dims[0]);
  for (size_t row : {size_t{0}, size_t{12345}, size_t{t.rows() - 1}}) {
    m.dequantize_weight_row(row, a.data());
    dequantize_row(t.type, t.data + row * ggml_row_bytes(t.type, t.dims[0]), b.data(), t.dims[0]);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << row;
  }
}

// Issue 24: the ISA loops above compare the AVX-512 kernels only where the CPU has AVX-512
// and pass without a word otherwise; this test turns that absence into a reported skip
// (allow-listed in CI, tests/skip_allowlist.txt, so a run on such a CPU says so).
TEST(Kernels, Avx512KernelsAreTestedOnThisCpu) {
  if (detect_isa() < Isa::Avx512) GTEST_SKIP() << "AVX-512 absent on this CPU: its kernels were not compared";
  EXPECT_GE(detect_isa(), Isa::Avx512);
}

// The same for AMX (Multiply.AmxPanel* run only where the CPU has it and the tile state is
// granted): a CPU without it says so.
TEST(Kernels, AmxKernelsAreTestedOnThisCpu) {
  if (detect_isa() < Isa::Amx) GTEST_SKIP() << "AMX absent on this CPU (or its tile state not granted): its GEMM was not run";
  EXPECT_EQ(detect_isa(), Isa::Amx);
}

// Issue 28 item 3: CHUNKFUSE_ISA caps the kernels at start-up (kernels.h), so that the AVX2
// kernels can be run (and benchmarked) on an AVX-512 machine. detect_isa() reads the variable
// once per process, so each setting runs this binary again as a child
// (IsaOverride.ReportsSelectedIsa) and reads back which ISA its multiplies and runtime kernels
// dispatch to.
TEST(IsaOverride, ReportsSelectedIsa) {
  // Run alone it only reports; IsaOverride.EnvironmentCapsTheKernels reads the line.
  std::printf("selected isa: %s\n", isa_name(active_isa()));
  EXPECT_EQ(active_isa(), detect_isa());
}

std::string child_selected_isa(const char* env) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);  // the shell's would be its own
  if (len <= 0) return "readlink failed";
  self[len] = '\0';
  const std::string cmd = std::string(env) + " '" + self + "' --gtest_filter=IsaOverride.ReportsSelectedIsa 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  const auto at = out.find("selected isa: ");
  if (status != 0 || at == std::string::npos) return "child failed: " + out;
  return out.substr(at + 14, out.find('\n', at) - at - 14);
}

TEST(IsaOverride, EnvironmentCapsTheKernels) {
  const std::string best = child_selected_isa("env -u CHUNKFUSE_ISA");
  // What a build-time cap cannot hide: with the variable unset the CPU's best ISA runs.
  ASSERT_TRUE(best == "portable" || best == "avx2" || best == "avx512" || best == "amx") << best;
  const std::vector<std::string> order{"portable", "avx2", "avx512", "amx"};
  const auto rank = [&](const std::string& n) { return std::find(order.begin(), order.end(), n) - order.begin(); };
  for (const std::string& cap : order) {
    const std::string want = rank(cap) < rank(best) ? cap : best;  // a cap above the CPU's best is no cap
    EXPECT_EQ(child_selected_isa(("env CHUNKFUSE_ISA=" + cap).c_str()), want) << "CHUNKFUSE_ISA=" << cap;
  }
  // An unknown value is ignored (with a warning on stderr): the CPU's best.
  EXPECT_EQ(child_selected_isa("env CHUNKFUSE_ISA=sse9"), best);
}

}  // namespace
}  // namespace cf

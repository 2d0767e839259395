// Portable reference kernels: exact format conversions, dequantization of every
// supported ggml type, activation quantization as llama.cpp does it, the generic vec-dot
// path, and the portable versions of the repacked tile kernels (bit-identical to SIMD).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/kernels.h"
#include "model/kernels_impl.h"

namespace cf {

// ---------------------------------------------------------------------------------------
// fp16 / bf16

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalize into a float exponent.
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {
    if (abs == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs & 0x7fffffu) >> 13));  // quiet nan, as F16C
  }
  const uint32_t exp = abs >> 23;
  if (exp < 113) {
    // Result is a half subnormal (or zero): value / 2^-24, rounded half to even.
    if (exp < 101) return sign;  // below half of the smallest subnormal
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t q = ((exp - 112) << 10) | ((abs & 0x7fffffu) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;  // carry may reach inf: correct
  if (q >= 0x7c00u) q = 0x7c00u;
  return static_cast<uint16_t>(sign | q);
}

float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

namespace kern {

float fp16_round(float f) { return fp16_to_fp32(fp32_to_fp16(f)); }

// Round half to even, nan made quiet (as ggml's fp32 -> bf16).
uint16_t fp32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

}  // namespace kern

// ---------------------------------------------------------------------------------------
// Dequantization (block layouts of ggml)

namespace {
using kern::load_u16;
using kern::kQK;
using kern::kQK_K;
using kern::k_scale_min;

inline float h2f(const uint8_t* p) { return fp16_to_fp32(load_u16(p)); }

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = h2f(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}
void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = h2f(b), m = h2f(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}
void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = h2f(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
    y[j] = static_cast<float>(((qs[j] & 0xF) | h0) - 16) * d;
    y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
  }
}
void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = h2f(b), m = h2f(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
    y[j] = static_cast<float>((qs[j] & 0xF) | h0) * d + m;
    y[j + 16] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
  }
}
void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = h2f(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}
void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0; j < 4; ++j) {  // 64 elements: 32 low nibbles, then 32 high nibbles
    uint8_t sc, m;
    k_scale_min(2 * j, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    k_scale_min(2 * j + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
    y += 64;
    q += 32;
  }
}
void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < 4; ++j) {
    uint8_t sc, m;
    k_scale_min(2 * j, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    k_scale_min(2 * j + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l)
      y[l] = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      y[32 + l] = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    y += 64;
    ql += 32;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}
void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = h2f(b + 208);
  for (int half = 0; half < 2; ++half) {  // 128 elements each
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * static_cast<float>(q1);
      y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
      y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
      y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}
}  // namespace

void dequantize_row(GgmlType t, const void* src_v, float* dst, size_t n) {
  const uint8_t* src = static_cast<const uint8_t*>(src_v);
  const auto info = ggml_type_info(t);
  if (n % info.block_elems != 0)
    throw std::invalid_argument("dequantize_row: " + std::to_string(n) + " is not a multiple of the " +
                                std::string(info.name) + " block");
  const size_t nblocks = n / info.block_elems;
  void (*block_fn)(const uint8_t*, float*) = nullptr;
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, n * 4); return;
    case GgmlType::F16:
      for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(src + 2 * i));
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(src + 2 * i));
      return;
    case GgmlType::Q4_0: block_fn = dequant_q4_0; break;
    case GgmlType::Q4_1: block_fn = dequant_q4_1; break;
    case GgmlType::Q5_0: block_fn = dequant_q5_0; break;
    case GgmlType::Q5_1: block_fn = dequant_q5_1; break;
    case GgmlType::Q8_0: block_fn = dequant_q8_0; break;
    case GgmlType::Q4_K: block_fn = dequant_q4_k; break;
    case GgmlType::Q5_K: block_fn = dequant_q5_k; break;
    case GgmlType::Q6_K: block_fn = dequant_q6_k; break;
    default: throw std::invalid_argument("dequantize_row: unsupported type " + std::string(info.name));
  }
  for (size_t b = 0; b < nblocks; ++b) block_fn(src + b * info.block_bytes, dst + b * info.block_elems);
}

// ---------------------------------------------------------------------------------------
// Activation quantization and the portable repacked tile kernels

namespace kern {

namespace {
// GCC's _mm512_reduce_add_ps: the upper half of the lanes added onto the lower, 8, 4, 2, 1.
float reduce16(const float lanes[16]) {
  float v[16];
  std::memcpy(v, lanes, sizeof v);
  for (int s = 8; s > 0; s /= 2)
    for (int i = 0; i < s; ++i) v[i] = v[i] + v[i + s];
  return v[0];
}
}  // namespace

float llama_half_dot(bool bf16, bool gemm, const float* w, const float* x, size_t cols) {
  float acc[4][16] = {};
  const size_t vec = gemm ? cols : cols / 64 * 64;  // the vec-dot leaves k % 64 to a scalar tail
  for (size_t k = 0; k < vec; ++k) {
    if (!bf16) {
      float& l = acc[gemm ? 0 : k / 16 % 4][k % 16];
      l = std::fma(w[k], x[k], l);
    } else if (k % 2 == 0) {  // one vdpbf16ps lane: the odd word, then the even one
      float& l = acc[gemm ? 0 : k / 32 % 2][k % 32 / 2];
      l = std::fma(w[k + 1], x[k + 1], l);
      l = std::fma(w[k], x[k], l);
    }
  }
  if (gemm) return reduce16(acc[0]);
  double sum;
  if (!bf16) {
    float t[16];
    for (int i = 0; i < 16; ++i) t[i] = (acc[0][i] + acc[2][i]) + (acc[1][i] + acc[3][i]);
    sum = reduce16(t);
  } else {
    sum = static_cast<double>(reduce16(acc[0])) + static_cast<double>(reduce16(acc[1]));
  }
  for (size_t k = vec; k < cols; ++k) sum += static_cast<double>(w[k] * x[k]);
  return static_cast<float>(sum);
}

namespace {

// Q8_0 / Q8_1 of one row into an ActView record, as llama.cpp's x86 quantize_row_q8_0/1.
void quantize_q8_portable(const float* x, size_t cols, uint8_t* out) {
  const size_t nb = cols / kQK;
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* dv = reinterpret_cast<float*>(out + nb * kQK);
  float* s16 = dv + nb;
  int32_t* cv = reinterpret_cast<int32_t*>(dv + 2 * nb);
  for (size_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQK;
    float amax = 0.0f;
    for (size_t j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0, group_sum[8] = {};
    for (size_t j = 0; j < kQK; ++j) {
      float q = std::nearbyint(xb[j] * id);  // default rounding: half to even
      q = std::min(127.0f, std::max(-128.0f, q));
      qs[b * kQK + j] = static_cast<int8_t>(q);
      sum += static_cast<int>(q);
      group_sum[j / 4] += static_cast<int>(q);
    }
    dv[b] = fp16_round(d);
    s16[b] = fp16_round(d * static_cast<float>(sum));
    for (int g = 0; g < 8; ++g) cv[8 * b + g] = -128 * group_sum[g];
  }
}

template <NibKind K>
void nib_tile_portable(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
                       size_t y_stride, unsigned o_lo, unsigned o_hi) {
  constexpr NibGeom G = nib_geom(K);
  for (size_t r = 0; r < nr; ++r) {
    const int8_t* xq = a.qs(r0 + r);
    const float* xd = a.d(r0 + r);
    const float* xs = a.s16(r0 + r);
    const int32_t* xc = a.corr(r0 + r);
    float lane[kTileRows][8] = {};
    float summ[kTileRows] = {};
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* wb = tile + b * G.block;
      const int8_t* q = xq + b * kQK;
      for (unsigned o = 0; o < kTileRows; ++o) {
        const float dd = fp16_to_fp32(load_u16(wb + G.d + 2 * o)) * xd[b];
        for (int g = 0; g < 8; ++g) {
          // Q4_0 / Q5_0 start at -8 / -16 sum(q) (corr = -128 sum(q)).
          int isum = G.start_shift ? xc[8 * b + g] / (1 << G.start_shift) : 0;
          for (int j = 0; j < 4; ++j) isum += nib_block_value<G.high_bits>(wb, o, 4 * g + j) * q[4 * g + j];
          lane[o][g] = std::fma(dd, static_cast<float>(isum), lane[o][g]);
        }
        if (G.has_min) summ[o] = std::fma(fp16_to_fp32(load_u16(wb + G.m + 2 * o)), xs[b], summ[o]);
      }
    }
    for (unsigned o = o_lo; o < o_hi; ++o) y[r * y_stride + o] = G.has_min ? hsum8_llama(lane[o]) + summ[o] : hsum8_llama(lane[o]);
  }
}

// Byte tiles: kByte16 (one fp16 d; Q8_0).
void byte_tile_portable(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
                        size_t y_stride, unsigned o_lo, unsigned o_hi) {
  for (size_t r = 0; r < nr; ++r) {
    const int8_t* xq = a.qs(r0 + r);
    const float* xd = a.d(r0 + r);
    float lane[kTileRows][8] = {};
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* wb = tile + b * kByte16TileBlock;
      const int8_t* q = xq + b * kQK;
      for (unsigned o = 0; o < kTileRows; ++o) {
        const float dd = fp16_to_fp32(load_u16(wb + 512 + 2 * o)) * xd[b];
        for (int g = 0; g < 8; ++g) {
          int sumi = 0;
          for (int j = 0; j < 4; ++j) sumi += (static_cast<int>(wb[64 * g + 4 * o + j]) - 128) * q[4 * g + j];
          lane[o][g] = std::fma(dd, static_cast<float>(sumi), lane[o][g]);
        }
      }
    }
    for (unsigned o = o_lo; o < o_hi; ++o) y[r * y_stride + o] = hsum8_llama(lane[o]);
  }
}

// Float tiles: each output by llama_half_dot from its row's words.
template <bool BF16, bool Gemm>
void half_tile_portable(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
                        size_t y_stride, unsigned o_lo, unsigned o_hi) {
  const size_t cols = nb * kQK;
  std::vector<float> w(cols), x(cols);
  for (unsigned o = o_lo; o < o_hi; ++o) {
    for (size_t b = 0; b < nb; ++b)
      for (size_t k = 0; k < kQK; ++k) {
        const uint16_t v = load_u16(tile + half_word_offset(nb, o, b, k));
        w[b * kQK + k] = BF16 ? bf16_to_fp32(v) : fp16_to_fp32(v);
      }
    for (size_t r = 0; r < nr; ++r) {
      if (BF16)
        for (size_t k = 0; k < cols; ++k) x[k] = a.xf(r0 + r)[k / kQK * kQK + bf16_act_pos(k % kQK)];
      else
        std::memcpy(x.data(), a.xf(r0 + r), cols * 4);
      y[r * y_stride + o] = llama_half_dot(BF16, Gemm, w.data(), x.data(), cols);
    }
  }
}

}  // namespace

const IsaKernels& isa_kernels_portable() {
  static const IsaKernels k{quantize_q8_portable,
                            quantize_q8_k_record,
                            nib_tile_portable<NibKind::Q4_1>,
                            nib_tile_portable<NibKind::Q4_0>,
                            nib_tile_portable<NibKind::Q5_1>,
                            nib_tile_portable<NibKind::Q5_0>,
                            byte_tile_portable,
                            half_tile_portable<false, false>,
                            half_tile_portable<true, false>,
                            half_tile_portable<false, true>,
                            half_tile_portable<true, true>,
                            kquant_tile_portable(KQuant::Q4),
                            kquant_tile_portable(KQuant::Q5),
                            kquant_tile_portable(KQuant::Q6),
                            round_f16_row,
                            round_bf16_row};
  return k;
}

// ---------------------------------------------------------------------------------------
// Generic vec-dot path (types that are not repacked). Activation record per weight type:
//   Q4_0/Q5_0/Q8_0: Q8_0 ActView record; Q4_1/Q5_1: Q8_1 ActView record;
//   K-quants: Q8_K = int8 qs[cols], float d[nb], int16 bsums[16 nb];
//   F16 / BF16: the activations rounded to that type; F32: the floats.
// Q4_1 and Q8_0 dots follow llama.cpp's order exactly (see kernels_impl.h); the other
// types accumulate per block in float in block order (llama.cpp's SIMD order differs; the
// difference is float rounding only). F32/F16/BF16 dots accumulate in double.

namespace {

// The generic path's Q8_K record: qs, d, int16 bsums (llama.cpp's block_q8_K fields).
void quantize_q8_k(const float* x, size_t cols, uint8_t* out) {
  const size_t nb = cols / kQK_K;
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* dv = reinterpret_cast<float*>(out + cols);
  int16_t* bs = reinterpret_cast<int16_t*>(out + cols + nb * 4);
  for (size_t b = 0; b < nb; ++b) {
    dv[b] = quantize_q8_k_block(x + b * kQK_K, qs + b * kQK_K);
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += qs[b * kQK_K + j * 16 + i];
      bs[b * 16 + j] = static_cast<int16_t>(sum);
    }
  }
}

float dot_q4_0(const uint8_t* w, const ActView& a, size_t nb) {
  float acc = 0.0f;
  const int8_t* xq = a.qs(0);
  for (size_t b = 0; b < nb; ++b, w += 18) {
    const uint8_t* qs = w + 2;
    const int8_t* q = xq + b * kQK;
    int sumi = 0;
    for (int j = 0; j < 16; ++j) sumi += ((qs[j] & 0xF) - 8) * q[j] + ((qs[j] >> 4) - 8) * q[j + 16];
    acc += static_cast<float>(sumi) * (h2f(w) * a.d(0)[b]);
  }
  return acc;
}
float dot_q4_1(const uint8_t* w, const ActView& a, size_t nb) {
  float lane[8] = {}, summ = 0.0f;
  const int8_t* xq = a.qs(0);
  for (size_t b = 0; b < nb; ++b, w += 20) {
    const uint8_t* qs = w + 4;
    const int8_t* q = xq + b * kQK;
    const float dd = h2f(w) * a.d(0)[b];
    for (int g = 0; g < 4; ++g) {
      int lo = 0, hi = 0;
      for (int j = 4 * g; j < 4 * g + 4; ++j) {
        lo += (qs[j] & 0xF) * q[j];
        hi += (qs[j] >> 4) * q[j + 16];
      }
      lane[g] = std::fma(dd, static_cast<float>(lo), lane[g]);
      lane[g + 4] = std::fma(dd, static_cast<float>(hi), lane[g + 4]);
    }
    summ = std::fma(h2f(w + 2), a.s16(0)[b], summ);
  }
  return hsum8_llama(lane) + summ;
}
float dot_q5_0(const uint8_t* w, const ActView& a, size_t nb) {
  float acc = 0.0f;
  const int8_t* xq = a.qs(0);
  for (size_t b = 0; b < nb; ++b, w += 22) {
    uint32_t qh;
    std::memcpy(&qh, w + 2, 4);
    const uint8_t* qs = w + 6;
    const int8_t* q = xq + b * kQK;
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      sumi += (((qs[j] & 0xF) | h0) - 16) * q[j] + (((qs[j] >> 4) | h1) - 16) * q[j + 16];
    }
    acc += static_cast<float>(sumi) * (h2f(w) * a.d(0)[b]);
  }
  return acc;
}
float dot_q5_1(const uint8_t* w, const ActView& a, size_t nb) {
  float acc = 0.0f;
  const int8_t* xq = a.qs(0);
  for (size_t b = 0; b < nb; ++b, w += 24) {
    uint32_t qh;
    std::memcpy(&qh, w + 4, 4);
    const uint8_t* qs = w + 8;
    const int8_t* q = xq + b * kQK;
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      sumi += ((qs[j] & 0xF) | h0) * q[j] + ((qs[j] >> 4) | h1) * q[j + 16];
    }
    acc += static_cast<float>(sumi) * (h2f(w) * a.d(0)[b]) + h2f(w + 2) * a.s16(0)[b];
  }
  return acc;
}
float dot_q8_0(const uint8_t* w, const ActView& a, size_t nb) {
  float lane[8] = {};
  const int8_t* xq = a.qs(0);
  for (size_t b = 0; b < nb; ++b, w += 34) {
    const int8_t* qs = reinterpret_cast<const int8_t*>(w + 2);
    const int8_t* q = xq + b * kQK;
    const float dd = h2f(w) * a.d(0)[b];
    for (int g = 0; g < 8; ++g) {
      int sumi = 0;
      for (int j = 4 * g; j < 4 * g + 4; ++j) sumi += qs[j] * q[j];
      lane[g] = std::fma(dd, static_cast<float>(sumi), lane[g]);
    }
  }
  return hsum8_llama(lane);
}

struct Q8KView {
  const int8_t* qs;
  const float* d;
  const int16_t* bsums;
};
Q8KView q8k_view(const uint8_t* rec, size_t cols) {
  const size_t nb = cols / kQK_K;
  return {reinterpret_cast<const int8_t*>(rec), reinterpret_cast<const float*>(rec + cols),
          reinterpret_cast<const int16_t*>(rec + cols + nb * 4)};
}

float dot_q4_k(const uint8_t* w, const Q8KView& x, size_t nb) {
  float acc = 0.0f;
  for (size_t b = 0; b < nb; ++b, w += 144) {
    const uint8_t* scales = w + 4;
    const uint8_t* ql = w + 16;
    const int8_t* q = x.qs + b * kQK_K;
    const int16_t* bs = x.bsums + b * 16;
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k_scale_min(j, scales, sc, m);
      const uint8_t* qsrc = ql + (j / 2) * 32;
      const int shift = (j & 1) * 4;
      int s = 0;
      for (int l = 0; l < 32; ++l) s += ((qsrc[l] >> shift) & 0xF) * q[j * 32 + l];
      sumi += sc * s;
      summ += m * (bs[2 * j] + bs[2 * j + 1]);
    }
    const float d = h2f(w) * x.d[b], dmin = h2f(w + 2) * x.d[b];
    acc += d * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
  }
  return acc;
}
float dot_q5_k(const uint8_t* w, const Q8KView& x, size_t nb) {
  float acc = 0.0f;
  for (size_t b = 0; b < nb; ++b, w += 176) {
    const uint8_t* scales = w + 4;
    const uint8_t* qh = w + 16;
    const uint8_t* ql = w + 48;
    const int8_t* q = x.qs + b * kQK_K;
    const int16_t* bs = x.bsums + b * 16;
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k_scale_min(j, scales, sc, m);
      const uint8_t* qsrc = ql + (j / 2) * 32;
      const int shift = (j & 1) * 4;
      int s = 0;
      for (int l = 0; l < 32; ++l) {
        const int v = ((qsrc[l] >> shift) & 0xF) + ((qh[l] >> j) & 1) * 16;
        s += v * q[j * 32 + l];
      }
      sumi += sc * s;
      summ += m * (bs[2 * j] + bs[2 * j + 1]);
    }
    const float d = h2f(w) * x.d[b], dmin = h2f(w + 2) * x.d[b];
    acc += d * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
  }
  return acc;
}
float dot_q6_k(const uint8_t* w, const Q8KView& x, size_t nb) {
  float acc = 0.0f;
  for (size_t b = 0; b < nb; ++b, w += 210) {
    const uint8_t* ql = w;
    const uint8_t* qh = w + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
    const int8_t* q = x.qs + b * kQK_K;
    int sumi = 0;
    for (int half = 0; half < 2; ++half) {
      int s[8] = {};  // per 16-element sub-block of this 128-element half
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        s[is] += q1 * q[l];
        s[is + 2] += q2 * q[l + 32];
        s[is + 4] += q3 * q[l + 64];
        s[is + 6] += q4 * q[l + 96];
      }
      for (int i = 0; i < 8; ++i) sumi += sc[i] * s[i];
      ql += 64;
      qh += 32;
      sc += 8;
      q += 128;
    }
    acc += h2f(w + 208) * x.d[b] * static_cast<float>(sumi);
  }
  return acc;
}

}  // namespace

size_t generic_act_row_bytes(uint32_t weight_type, size_t cols) {
  switch (static_cast<GgmlType>(weight_type)) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0:
      return act_row_stride(cols / kQK);
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return (cols + cols / kQK_K * (4 + 32) + 63) / 64 * 64;
    case GgmlType::F16: case GgmlType::BF16: return (cols * 2 + 63) / 64 * 64;
    case GgmlType::F32: return (cols * 4 + 63) / 64 * 64;
    default: throw std::invalid_argument("no vec-dot kernel for this weight type");
  }
}

void generic_quantize_row(uint32_t weight_type, const float* x, size_t cols, uint8_t* out) {
  switch (static_cast<GgmlType>(weight_type)) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::Q4_1: case GgmlType::Q5_1:
      quantize_q8_portable(x, cols, out);
      return;
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: quantize_q8_k(x, cols, out); return;
    case GgmlType::F16:
      for (size_t i = 0; i < cols; ++i) {
        const uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < cols; ++i) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::F32: std::memcpy(out, x, cols * 4); return;
    default: throw std::invalid_argument("no vec-dot kernel for this weight type");
  }
}

float generic_dot(uint32_t weight_type, const uint8_t* w, const uint8_t* act, size_t cols) {
  const ActView a{act, 0, cols / kQK};
  switch (static_cast<GgmlType>(weight_type)) {
    case GgmlType::Q4_0: return dot_q4_0(w, a, a.nb);
    case GgmlType::Q4_1: return dot_q4_1(w, a, a.nb);
    case GgmlType::Q5_0: return dot_q5_0(w, a, a.nb);
    case GgmlType::Q5_1: return dot_q5_1(w, a, a.nb);
    case GgmlType::Q8_0: return dot_q8_0(w, a, a.nb);
    case GgmlType::Q4_K: return dot_q4_k(w, q8k_view(act, cols), cols / kQK_K);
    case GgmlType::Q5_K: return dot_q5_k(w, q8k_view(act, cols), cols / kQK_K);
    case GgmlType::Q6_K: return dot_q6_k(w, q8k_view(act, cols), cols / kQK_K);
    case GgmlType::F16: {
      double acc = 0;
      for (size_t i = 0; i < cols; ++i)
        acc += static_cast<double>(fp16_to_fp32(load_u16(w + 2 * i))) * fp16_to_fp32(load_u16(act + 2 * i));
      return static_cast<float>(acc);
    }
    case GgmlType::BF16: {
      double acc = 0;
      for (size_t i = 0; i < cols; ++i)
        acc += static_cast<double>(bf16_to_fp32(load_u16(w + 2 * i))) * bf16_to_fp32(load_u16(act + 2 * i));
      return static_cast<float>(acc);
    }
    case GgmlType::F32: {
      double acc = 0;
      for (size_t i = 0; i < cols; ++i) {
        float wv, xv;
        std::memcpy(&wv, w + 4 * i, 4);
        std::memcpy(&xv, act + 4 * i, 4);
        acc += static_cast<double>(wv) * xv;
      }
      return static_cast<float>(acc);
    }
    default: throw std::invalid_argument("no vec-dot kernel for this weight type");
  }
}

}  // namespace kern
}  // namespace cf

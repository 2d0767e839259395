// Internal to the kernels: the prefill GEMM over "panels", in a summation order of our own
// (docs/ARCHITECTURE.md, "Numerics contract": kernels are held to references that do not
// depend on order, not to llama.cpp's bits).
//
// Every block-quantized tile (nibble tiles, Q8_0 byte tiles, K super-tiles; kernels_impl.h) is
// unpacked, one 16-row tile at a time, into a panel in the calling thread's cache: per
// 32-block, its 16 rows x 32 values as unsigned bytes and two float vectors of per-row
// factors. The micro-kernels then multiply a panel by many activation rows, each 32-block's
// 8 vpdpbusd-style groups summed in one int32 accumulator (two for Q6_K's 16-element
// scales) and one float step per block: the whole block's integer sum is exact, and the
// only rounding left is one or two conversions and FMAs per block. The unpacking costs a
// few ops per 64 bytes and is shared by the up to 64 activation rows of one task, so the
// cost per multiply-add is the micro-kernel's.
//
// Per element, every ISA computes the same float sequence (portable, AVX2 and AVX-512 give
// the same bits, so the ISA tests stay exact; only the order differs from llama.cpp's):
//   Offset kinds (Q4_0, Q5_0, Q8_0): w = scale (u - off); per block
//     i = sum u q - off sum q (int32, exact), acc = fma(float(i), scale * dx, acc);
//   Min kinds (Q4_1, Q5_1, Q4_K, Q5_K): w = scale u + second; per block
//     i = sum u q, acc = fma(float(i), scale * dx, acc), acc = fma(second, s, acc);
//   Sub16 (Q6_K): w = scale (u - 32) on elements 0..15 and second (u - 32) on 16..31; per
//     block the two halves' exact sums i_lo, i_hi, acc = fma(float(i_lo), scale * dx, acc),
//     acc = fma(float(i_hi), second * dx, acc);
// with scale * dx rounded to float first, s = dx * sum q, acc starting at 0, y = acc.
// K-quant factors: scale = d sc_j, second = -dmin m_j (Q4_K/Q5_K); d sc_lo and d sc_hi
// (Q6_K), each product exact in float (an fp16 times an integer below 2^8).
// Activations are quantized per 32-block: dx = amax / 127 (kept as float, where llama.cpp
// rounds it to fp16), q = round-half-even(x * 127 / amax). For the K-quants that is 8x
// finer than llama.cpp's Q8_K (one scale per 256), which is what keeps this GEMM within the
// f64 contract on the default model: its ffn_down inputs carry outliers of a few thousand
// at the first positions, and one scale per 256 crushes their neighbours (measured: with
// llama.cpp's Q8_K super-tile GEMM for the K-quants, max |diff| to f64 1.62 at position 1
// of a prompt, bound 1.22, llama.cpp 0.81; with these panels 0.71). A Q8_K GEMM sums a whole
// super-block in int32 and measured ~1.5x faster on those matrices: the price of the bound.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "model/kernels.h"
#include "model/kernels_impl.h"

namespace cf::kern {

// One 32-block of a panel: [0, 512) values, group g (elements 4g..4g+3) of row o at
// [64 g + 4 o + j] (the nibble tiles' own group order, so that one vector load is one group
// of 16 rows); [512, 576) float scale[16]; [576, 640) float second[16].
constexpr size_t kPanelBlock = 640;
constexpr size_t kPanelScale = 512, kPanelSecond = 576;

enum class PanelKind { Offset, Min, Sub16 };

// Which panel a repacked weight type unpacks to.
struct PanelType {
  PanelKind kind;
  int offset;  // Offset and Sub16 kinds: w = scale (u - offset)
};

inline constexpr PanelType panel_type(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return {PanelKind::Offset, 8};
    case GgmlType::Q5_0: return {PanelKind::Offset, 16};
    case GgmlType::Q8_0: return {PanelKind::Offset, 128};
    case GgmlType::Q6_K: return {PanelKind::Sub16, 32};
    default: break;
  }
  return {PanelKind::Min, 0};
}

// Activation record of the panel GEMM, one per row: int8 qs[32 nb], float dx[nb],
// float s[nb] = dx * sum q (the min kinds' second term), int32 corr[nb] and corr_hi[nb]:
// the offset kinds' integer correction -offset * sum q (Sub16: over elements 0..15 in corr,
// 16..31 in corr_hi), made here once per row for the weight type at hand so that the kernel
// starts each block's sum from one broadcast load. Read through ActView: qs(r); the rest
// through these.
inline size_t panel_act_row_stride(size_t nb) { return (nb * (kQK + 16) + 63) / 64 * 64; }
inline const float* panel_dx(const ActView& a, size_t r) { return a.d(r); }
inline const float* panel_s(const ActView& a, size_t r) { return a.d(r) + a.nb; }
inline const int32_t* panel_corr(const ActView& a, size_t r) { return reinterpret_cast<const int32_t*>(a.d(r) + 2 * a.nb); }
inline const int32_t* panel_corr_hi(const ActView& a, size_t r) { return panel_corr(a, r) + a.nb; }

// count adjacent 16-row tiles (tile_bytes each) at once: lanes [lo, 16) of the first,
// [0, hi) of the last (both of a single tile), every lane of the others; y at lane 0 of the
// first; otherwise as TileKernelFn.
using TileRangeFn = void (*)(const uint8_t* tiles, size_t tile_bytes, size_t count, size_t nb, const ActView& a,
                             size_t r0, size_t nr, float* y, size_t y_stride, unsigned lo, unsigned hi);

// Each ISA's panel entry points (kernels_panel.cpp, kernels_panel_avx2.cpp,
// kernels_panel_avx512.cpp).
struct PanelKernels {
  // Activation row r into the records at `records` (stride bytes per row), for weights of
  // the given panel type: the record above at records + r * stride (row_major_quantize),
  // or the kernel's own layout.
  void (*quantize)(const float* x, size_t cols, uint8_t* records, size_t r, size_t stride, PanelType type);
  // The tile kernel of a repacked weight type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
  // Q6_K): unpacks the tile into the thread's panel, then runs every activation row. Null
  // where `range` is set.
  TileKernelFn (*tile)(GgmlType);
  // Or a task's whole range of tiles in one call (AMX: its loop order spans tiles).
  TileRangeFn (*range)(GgmlType) = nullptr;
  // Bytes per activation record of nb blocks (panel_act_row_stride, or the kernel's own).
  size_t (*row_stride)(size_t nb) = panel_act_row_stride;
  // The kernel reads activation records in groups of this many rows (AMX: a 16-row tile),
  // so the records' buffer holds n rounded up to it (the extra rows' results are dropped).
  size_t row_group = 1;
  // Activation rows per task: each task unpacks its tiles once, so more rows share that
  // cost (a multiple of row_group).
  size_t row_chunk = 256;
};
const PanelKernels& panel_kernels_portable();
const PanelKernels& panel_kernels_avx2();
const PanelKernels& panel_kernels_avx512();
// AMX (kernels_panel_amx.cpp): BF16 tiles, in an order of their own and to a tolerance,
// not to the bits above (docs/ARCHITECTURE.md, "Numerics contract").
const PanelKernels& panel_kernels_amx();
// Whether a weight type has panel kernels.
bool has_panel(GgmlType);

// The kernel of type t from an ISA's kernel template: pick.template operator()<T>() for the
// T that t names (each ISA file passes []<GgmlType T>() { return &its_tile<T>; }).
template <class Pick>
auto panel_kernel_for(GgmlType t, Pick pick) -> decltype(pick.template operator()<GgmlType::Q4_0>()) {
  switch (t) {
    case GgmlType::Q4_0: return pick.template operator()<GgmlType::Q4_0>();
    case GgmlType::Q4_1: return pick.template operator()<GgmlType::Q4_1>();
    case GgmlType::Q5_0: return pick.template operator()<GgmlType::Q5_0>();
    case GgmlType::Q5_1: return pick.template operator()<GgmlType::Q5_1>();
    case GgmlType::Q8_0: return pick.template operator()<GgmlType::Q8_0>();
    case GgmlType::Q4_K: return pick.template operator()<GgmlType::Q4_K>();
    case GgmlType::Q5_K: return pick.template operator()<GgmlType::Q5_K>();
    case GgmlType::Q6_K: return pick.template operator()<GgmlType::Q6_K>();
    default: return nullptr;
  }
}

// The calling thread's scratch buffer `slot` (0: the panel; 1, 2: a kernel's own), at
// least `bytes`, 64-byte aligned; kept for the thread's next call.
uint8_t* thread_scratch(int slot, size_t bytes);
// The calling thread's panel scratch, at least nb blocks.
uint8_t* panel_scratch(size_t nb);

// Internal linkage on purpose: each ISA's file compiles these with its own flags (and
// vectorizes the byte loops with them); one shared instantiation would run AVX-512 code on
// an AVX2 machine.
namespace {

// The 512 value bytes of a nibble block with HB high-bit lines (kernels_impl.h's layout):
// line L's low nibbles are group L, its high nibbles group L + 4, each byte in place.
template <int HB>
inline void panel_unpack_nibbles(const uint8_t* blk, uint8_t* out) {
  for (int line = 0; line < 4; ++line) {
    const uint8_t* v = blk + 64 * line;
    uint8_t* lo = out + 64 * line;
    uint8_t* hi = out + 64 * (line + 4);
    for (int i = 0; i < 64; ++i) {
      uint8_t a = v[i] & 0x0F, b = v[i] >> 4;
      if constexpr (HB > 0) {
        constexpr uint8_t mask = (1 << HB) - 1;
        const int bit_a = line * HB, bit_b = (line + 4) * HB;
        a |= static_cast<uint8_t>(((blk[256 + 64 * (bit_a / 8) + i] >> (bit_a % 8)) & mask) << 4);
        b |= static_cast<uint8_t>(((blk[256 + 64 * (bit_b / 8) + i] >> (bit_b % 8)) & mask) << 4);
      }
      lo[i] = a;
      hi[i] = b;
    }
  }
}

inline float* panel_scale(uint8_t* pb) { return reinterpret_cast<float*>(pb + kPanelScale); }
inline float* panel_second(uint8_t* pb) { return reinterpret_cast<float*>(pb + kPanelSecond); }
inline const float* panel_scale(const uint8_t* pb) { return reinterpret_cast<const float*>(pb + kPanelScale); }
inline const float* panel_second(const uint8_t* pb) { return reinterpret_cast<const float*>(pb + kPanelSecond); }

// The portable conversion of 16 fp16 values (each ISA passes its own: vcvtph2ps).
inline void panel_fp16x16(const uint8_t* src, float* dst) {
  for (int i = 0; i < 16; ++i) dst[i] = fp16_to_fp32(load_u16(src + 2 * i));
}

// Unpacks one repacked 16-row tile of `type` (nb 32-blocks) into nb panel blocks; cvt16
// converts 16 fp16 values to floats.
template <class Cvt16>
inline void panel_unpack_tile(GgmlType type, const uint8_t* tile, size_t nb, uint8_t* panel, Cvt16 cvt16) {
  auto nib = [&](NibKind k) {
    const NibGeom g = nib_geom(k);
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* blk = tile + b * g.block;
      uint8_t* pb = panel + b * kPanelBlock;
      if (g.high_bits) panel_unpack_nibbles<1>(blk, pb);
      else panel_unpack_nibbles<0>(blk, pb);
      cvt16(blk + g.d, panel_scale(pb));
      if (g.has_min) cvt16(blk + g.m, panel_second(pb));
      else std::memset(panel_second(pb), 0, kTileRows * sizeof(float));
    }
  };
  auto ksuper = [&](KQuant q) {
    const KTileGeom g = ktile_geom(q);
    for (size_t sb = 0; sb < nb / 8; ++sb) {
      const uint8_t* t = tile + sb * g.bytes;
      float d[kTileRows], dmin[kTileRows] = {};
      cvt16(t + g.d, d);
      if (q != KQuant::Q6) cvt16(t + g.dmin, dmin);
      for (size_t c = 0; c < 8; ++c) {
        uint8_t* pb = panel + (8 * sb + c) * kPanelBlock;
        const uint8_t* blk = t + c * g.block;
        if (g.high_bits == 0) panel_unpack_nibbles<0>(blk, pb);
        else if (g.high_bits == 1) panel_unpack_nibbles<1>(blk, pb);
        else panel_unpack_nibbles<2>(blk, pb);
        float* scale = panel_scale(pb);
        float* second = panel_second(pb);
        if (q == KQuant::Q6) {  // the halves' scales, int8
          for (unsigned o = 0; o < kTileRows; ++o) {
            scale[o] = d[o] * static_cast<float>(static_cast<int8_t>(t[g.sc + 16 * c + o]));
            second[o] = d[o] * static_cast<float>(static_cast<int8_t>(t[g.sc_hi + 16 * c + o]));
          }
        } else {  // 6-bit scale and min, as bytes
          for (unsigned o = 0; o < kTileRows; ++o) {
            scale[o] = d[o] * static_cast<float>(t[g.sc + 16 * c + o]);
            second[o] = -dmin[o] * static_cast<float>(t[g.m + 16 * c + o]);
          }
        }
      }
    }
  };
  switch (type) {
    case GgmlType::Q4_0: return nib(NibKind::Q4_0);
    case GgmlType::Q4_1: return nib(NibKind::Q4_1);
    case GgmlType::Q5_0: return nib(NibKind::Q5_0);
    case GgmlType::Q5_1: return nib(NibKind::Q5_1);
    case GgmlType::Q8_0:
      for (size_t b = 0; b < nb; ++b) {
        const uint8_t* blk = tile + b * kByte16TileBlock;
        uint8_t* pb = panel + b * kPanelBlock;
        std::memcpy(pb, blk, 512);
        cvt16(blk + 512, panel_scale(pb));
        std::memset(panel_second(pb), 0, kTileRows * sizeof(float));
      }
      return;
    case GgmlType::Q4_K: return ksuper(KQuant::Q4);
    case GgmlType::Q5_K: return ksuper(KQuant::Q5);
    case GgmlType::Q6_K: return ksuper(KQuant::Q6);
    default: break;
  }
}

// The PanelKernels::quantize of the row-major records (panel_act_row_stride).
inline void row_major_quantize(const float* x, size_t cols, uint8_t* records, size_t r, size_t stride, PanelType type);

// The per-block fields of a panel record (panel_act_row_stride) after block b's quants:
// dx from its max |x|, s and the offset kinds' corrections from the halves' sums of q. One
// definition for the portable loop and each ISA's vector quantizer, so they write the same bits.
struct PanelRecordFields {
  float* dx;
  float* s;
  int32_t* corr;
  int32_t* corr_hi;
  PanelRecordFields(uint8_t* out, size_t nb)
      : dx(reinterpret_cast<float*>(out + nb * kQK)), s(dx + nb), corr(reinterpret_cast<int32_t*>(s + nb)),
        corr_hi(corr + nb) {}
  void set(size_t b, float amax, int32_t sum_lo, int32_t sum_hi, PanelType type) const {
    dx[b] = amax / 127.0f;
    s[b] = dx[b] * static_cast<float>(sum_lo + sum_hi);
    const bool halves = type.kind == PanelKind::Sub16;
    corr[b] = -type.offset * (halves ? sum_lo : sum_lo + sum_hi);
    corr_hi[b] = halves ? -type.offset * sum_hi : 0;
  }
};

// The quantization step of a block with max |x| amax: q = round-half-even(x * id).
inline float panel_quant_factor(float amax) { return amax != 0.0f ? 127.0f / amax : 0.0f; }

// One activation row into a panel record (panel_act_row_stride). Round half to even by
// adding 1.5 * 2^23 (exact for |v| <= 127). The definition each ISA's quantizer reproduces
// bit for bit (kernels_panel_avx2.cpp, kernels_panel_avx512.cpp; the Multiply tests compare).
inline void panel_quantize_row(const float* x, size_t cols, uint8_t* out, PanelType type) {
  const size_t nb = cols / kQK;
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  const PanelRecordFields rec(out, nb);
  for (size_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQK;
    float amax = 0.0f;
    for (size_t k = 0; k < kQK; ++k) {  // not std::fmax: a libm call
      const float v = std::fabs(xb[k]);
      amax = v > amax ? v : amax;
    }
    const float id = panel_quant_factor(amax);
    int8_t* q = qs + b * kQK;
    int32_t sum[2] = {0, 0};  // elements 0..15 and 16..31
    for (size_t h = 0; h < 2; ++h)
      for (size_t k = 16 * h; k < 16 * h + 16; ++k) {
        const float shifted = xb[k] * id + 12582912.0f;
        int32_t bits;
        std::memcpy(&bits, &shifted, 4);
        const int32_t v = (bits & 0x007fffff) - 0x00400000;
        q[k] = static_cast<int8_t>(v);
        sum[h] += v;
      }
    rec.set(b, amax, sum[0], sum[1], type);
  }
}

inline void row_major_quantize(const float* x, size_t cols, uint8_t* records, size_t r, size_t stride, PanelType type) {
  panel_quantize_row(x, cols, records + r * stride, type);
}

}  // namespace

}  // namespace cf::kern

// Internal to the kernels: the repacked weight layouts, the quantized-activation buffer,
// and the per-ISA function table that kernels.cpp dispatches to.
//
// Numerics shared by every ISA (so portable, AVX2 and AVX-512 give bit-identical y), and
// the same float operation sequence as llama.cpp's x86 vec-dot kernels (AVX2 branch, which
// the AVX-512 build compiles too), so both engines round alike:
//  - activations are quantized per 32-block exactly as llama.cpp's x86 quantize_row_q8_0/1:
//    amax, d = amax/127 (stored as fp16), id = 127/amax, q = round-half-even(x*id);
//    Q8_1 also keeps s = fp16(d * sum(q)) with the unrounded d.
//  - per output element, 8 float lanes: lane g (g < 8) holds the exact integer dot of the
//    block's elements 4g..4g+3 (what one int32 lane of vpdpbusd yields), and per block, in
//    block order, lane[g] = fma(dw*dx, float(isum_g), lane[g]) with dw*dx rounded to float;
//  - Q4_1 also sums its min term separately: summ = fma(mw, sx, summ) per block;
//  - the result is hsum8(lane) (+ summ for Q4_1), hsum8 = llama.cpp's hsum_float_8:
//    ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
//    (Its tinyBLAS Q8_0 GEMM for batched logits has the same per-element sequence.)
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cf::kern {

constexpr size_t kQK = 32;          // elements per Q4_1 / Q8_0 / Q8_1 block
constexpr size_t kQK_K = 256;       // elements per K-quant super-block
constexpr size_t kTileRows = 16;    // output rows interleaved in one repacked tile

// Repacked Q4_1, per tile of 16 output rows and per 32-element block (320 bytes, same
// size as the file's 16 blocks):
//   bytes [64g + 4o + j], g < 4, o < 16, j < 4: byte 4g+j of row o's qs (its low nibble
//     is element 4g+j, its high nibble element 16+4g+j);
//   then 16 fp16 d (row order), then 16 fp16 m.
constexpr size_t kQ4_1TileBlock = 320;
// Repacked Q8_0, per tile and block (544 bytes): bytes [64g + 4o + j], g < 8: element
// 4g+j of row o stored as uint8 (w + 128), the unsigned operand of vpdpbusd; then 16 fp16 d.
constexpr size_t kQ8_0TileBlock = 544;

// Activations quantized to 8 bits per 32-block, one record per row:
//   int8 qs[cols], float d[nb] (the fp16 value as float), then the aux field:
//   for Q8_1 the float s[nb] = fp16(d*sum q); for Q8_0 the int32 corr[8 nb]:
//   -128 * (sum of the 4 q of group g of block b) at [8b + g] (the VNNI offset correction
//   of each 4-element lane).
struct ActView {
  const uint8_t* base = nullptr;
  size_t stride = 0;  // bytes per row
  size_t nb = 0;      // blocks per row

  const int8_t* qs(size_t r) const { return reinterpret_cast<const int8_t*>(base + r * stride); }
  const float* d(size_t r) const { return reinterpret_cast<const float*>(base + r * stride + nb * kQK); }
  const float* s(size_t r) const { return d(r) + nb; }
  const int32_t* corr(size_t r) const {
    return reinterpret_cast<const int32_t*>(base + r * stride + nb * kQK + nb * 4);
  }
};
inline size_t act_row_stride(size_t nb) { return (nb * kQK + nb * 4 + nb * 32 + 63) / 64 * 64; }

// Quantizes one row of `cols` floats into an ActView record at `out`.
// q8_1 selects the aux field (s for Q8_1, the int correction for Q8_0).
using QuantizeRowFn = void (*)(const float* x, size_t cols, uint8_t* out, bool q8_1);

// Computes output lanes [o_lo, o_hi) of one 16-row tile for activation rows
// [r0, r0 + nr): y[(r - r0) * y_stride + o] for o in the tile (y points at lane 0).
using TileKernelFn = void (*)(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr,
                              float* y, size_t y_stride, unsigned o_lo, unsigned o_hi);

struct IsaKernels {
  QuantizeRowFn quantize_q8;
  TileKernelFn q4_1;
  TileKernelFn q8_0;
};

const IsaKernels& portable_kernels();
const IsaKernels& avx2_kernels();
const IsaKernels& avx512_kernels();

// llama.cpp's hsum_float_8 over the 8 per-group lanes of one output element.
inline float hsum8_llama(const float l[8]) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// Portable helpers shared by the ISA files.
float fp16_round(float f);  // f -> fp16 -> f (round half to even), as F16C does
uint16_t fp32_to_bf16(float f);

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint16_t load_u16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Generic (non-repacked) path: activations converted for the weight type's vec-dot type,
// one record per row, and the dot of one weight row with one such record.
size_t generic_act_row_bytes(uint32_t weight_type, size_t cols);
void generic_quantize_row(uint32_t weight_type, const float* x, size_t cols, uint8_t* out);
float generic_dot(uint32_t weight_type, const uint8_t* w_row, const uint8_t* act_row, size_t cols);

}  // namespace cf::kern

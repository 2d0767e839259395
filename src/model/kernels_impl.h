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
//  - Q4_1 also sums its min term separately: summ = fma(mw, s16, summ) per block;
//  - the result is hsum8(lane) (+ summ for Q4_1), hsum8 = llama.cpp's hsum_float_8:
//    ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
//    (Its tinyBLAS Q8_0 GEMM for batched logits has the same per-element sequence.)
// Q4_1, Q4_0, Q8_0, Q5_0 and Q5_1 follow that order bit for bit. The K-quants use the
// same lanes with float scales (dw = d_lo for groups 0..3, d_hi for 4..7) and a min term
// summ = fma(m, sx, summ) on the exact block sum; llama.cpp quantizes activations per 256
// for the K-quants (Q8_K), so there the two engines differ by rounding only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cf::kern {

constexpr size_t kQK = 32;          // elements per Q4_1 / Q8_0 / Q8_1 block
constexpr size_t kQK_K = 256;       // elements per K-quant super-block
constexpr size_t kTileRows = 16;    // output rows interleaved in one repacked tile

// Every block-quantized weight type is repacked at load into one of four tile layouts of
// 16 output rows x one 32-element block, so that one kernel family serves them all (the
// file's own block layouts differ per type; after repacking only these shapes remain):
//
// Nibble tiles (4-bit weights), bytes [64g + 4o + j], g < 4, o < 16, j < 4: byte 4g+j of
//   row o's 16 packed bytes (low nibble = element 4g+j, high nibble = element 16+4g+j).
//   - kNib16 (Q4_1, Q4_0; 320 bytes, the file's size): then 16 fp16 d, 16 fp16 m.
//     Q4_1: w = d q + m. Q4_0: w = d (q - 8), m unused (the kernel subtracts 8 sum(x)).
//   - kNib32 (Q4_K; 384 bytes): then 16 float d, 16 float m: w = d q + m, where d = d_super
//     * sc and m = -dmin * min are exact in float (fp16 x 6-bit integer).
// Byte tiles (weights stored as uint8 u = q + 128, the unsigned operand of vpdpbusd),
//   bytes [64g + 4o + j], g < 8: element 4g+j of row o.
//   - kByte16 (Q8_0, Q5_0; 544 bytes): then 16 fp16 d: w = d (u - 128).
//   - kByte32 (Q6_K, Q5_K, Q5_1; 640 bytes, or 704 with a min): 16 float d_lo (elements
//     0..15), 16 float d_hi (16..31), [16 float m]: w = d_half (u - 128) + m. Q6_K has a
//     scale per 16 elements; the per-group float lanes below make that free.
// Float tiles (F16, BF16 weights; 1024 bytes per 32 k): the 16-bit words of the 16 rows at
//   k = 0..31 as [k][o]. Their activations are floats rounded through the weight's type
//   (llama.cpp's vec-dot type for F16/BF16), one float row each; per output element two
//   fma chains in k order, over even k and odd k, then their sum (the same on every ISA).
constexpr size_t kHalfTileBlock = 1024;
constexpr size_t kNib16TileBlock = 320;
constexpr size_t kNib32TileBlock = 384;
constexpr size_t kByte16TileBlock = 544;
inline constexpr size_t byte32_tile_block(bool has_min) { return has_min ? 704 : 640; }
// Kept for the Q4_1/Q8_0 tests and comments that name the file types.
constexpr size_t kQ4_1TileBlock = kNib16TileBlock;
constexpr size_t kQ8_0TileBlock = kByte16TileBlock;

// Activations quantized to 8 bits per 32-block (llama.cpp's x86 quantize_row_q8_0/1 rule),
// one record per row: int8 qs[32 nb], float d[nb] (the fp16 value as float), float s16[nb]
// = fp16(d_unrounded * sum q) (llama.cpp's Q8_1 s, used by Q4_1 for bit-exactness), float
// sx[nb] = d * sum q in float (the exact block sum for the min terms of the K-quants and
// Q5_1), int32 corr[8 nb] = -128 * (sum of the 4 q of group g of block b) at [8b + g] (the
// offset correction of the u = q + 128 byte encoding; Q4_0 uses corr / 16 = -8 sum).
struct ActView {
  const uint8_t* base = nullptr;
  size_t stride = 0;  // bytes per row
  size_t nb = 0;      // blocks per row

  const int8_t* qs(size_t r) const { return reinterpret_cast<const int8_t*>(base + r * stride); }
  const float* d(size_t r) const { return reinterpret_cast<const float*>(base + r * stride + nb * kQK); }
  const float* s16(size_t r) const { return d(r) + nb; }
  const float* sx(size_t r) const { return d(r) + 2 * nb; }
  const int32_t* corr(size_t r) const { return reinterpret_cast<const int32_t*>(d(r) + 3 * nb); }
  const float* xf(size_t r) const { return reinterpret_cast<const float*>(base + r * stride); }  // float tiles
};
inline size_t act_row_stride(size_t nb) { return (nb * (kQK + 12 + 32) + 63) / 64 * 64; }
inline size_t float_act_row_stride(size_t nb) { return nb * kQK * 4; }  // a multiple of 64

// Quantizes one row of `cols` floats into an ActView record at `out` (every field).
using QuantizeRowFn = void (*)(const float* x, size_t cols, uint8_t* out);

// Computes output lanes [o_lo, o_hi) of one 16-row tile for activation rows
// [r0, r0 + nr): y[(r - r0) * y_stride + o] for o in the tile (y points at lane 0).
using TileKernelFn = void (*)(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr,
                              float* y, size_t y_stride, unsigned o_lo, unsigned o_hi);

// One kernel per (tile layout, weight interpretation).
struct IsaKernels {
  QuantizeRowFn quantize_q8;
  TileKernelFn q4_1;       // kNib16, + m s16
  TileKernelFn q4_0;       // kNib16, - 8 sum(x)
  TileKernelFn nib32;      // kNib32, + m sx (Q4_K)
  TileKernelFn q8_0;       // kByte16 (Q8_0, Q5_0)
  TileKernelFn byte32;     // kByte32 without min (Q6_K)
  TileKernelFn byte32_min; // kByte32 with min, m * sx (Q5_K)
  TileKernelFn q5_1;       // kByte32 with min, m * s16 (Q5_1, llama.cpp's Q8_1 order)
  TileKernelFn f16;        // float tiles of fp16 words
  TileKernelFn bf16;       // float tiles of bf16 words
};

const IsaKernels& portable_kernels();
const IsaKernels& avx2_kernels();
const IsaKernels& avx512_kernels();

// Repacking (kernels_repack.cpp): which tile layout each block-quantized weight type
// takes, the repack of a whole matrix, and row o back as floats (bit-identical to
// dequantize_row of the file's row: the same float operations on the same values).
enum class TileLayout { None, Nib16, Nib32, Byte16, Byte32, Byte32Min, Half };
// None: not repacked (F32; F16/BF16 rows that are not whole 32-blocks).
TileLayout tile_layout_for(uint32_t weight_type, size_t cols);
size_t tile_block_bytes(TileLayout);
// packed: ceil(rows/16) tiles of nb * tile_block_bytes bytes, written in full (padding
// rows are zero).
void repack_matrix(uint32_t weight_type, const uint8_t* data, size_t rows, size_t cols, uint8_t* packed);
void dequantize_packed_row(uint32_t weight_type, const uint8_t* packed, size_t cols, size_t o, float* dst);
// One activation row for a float tile: x rounded through F16 or BF16 (as floats).
void round_act_row(uint32_t weight_type, const float* x, size_t cols, float* out);

// Which weight interpretation a tile kernel applies (the template parameter of every ISA's
// kernel family; the layouts are described above).
enum class NibKind { Q4_1, Q4_0, Nib32 };
// The min term of a byte tile: none, m * sx (exact block sum), or m * s16 (Q8_1's s).
enum class MinSum { None, Exact, Fp16 };

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
inline float load_f32(const void* p) {
  float v;
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

// Internal to the kernels: the repacked weight layouts, the quantized-activation buffer,
// and the per-ISA function table that kernels.cpp dispatches to.
//
// These are the one-row (vec-dot) kernels, which decode runs; batched rows of block-quantized
// weights take the panel GEMM (kernels_panel.h). Numerics shared by every ISA (so portable,
// AVX2 and AVX-512 give bit-identical y), and the same float operation sequence as
// llama.cpp's x86 vec-dot kernels (AVX2 branch, which the AVX-512 build compiles too):
//  - activations are quantized per 32-block exactly as llama.cpp's x86 quantize_row_q8_0/1:
//    amax, d = amax/127 (stored as fp16), id = 127/amax, q = round-half-even(x*id);
//    Q8_1 also keeps s = fp16(d * sum(q)) with the unrounded d.
//  - per output element, 8 float lanes: lane g (g < 8) holds the exact integer dot of the
//    block's elements 4g..4g+3 (what one int32 lane of vpdpbusd yields), and per block, in
//    block order, lane[g] = fma(dw*dx, float(isum_g), lane[g]) with dw*dx rounded to float;
//  - Q4_1 and Q5_1 also sum their min term separately: summ = fma(mw, s16, summ) per block;
//  - the result is hsum8(lane) (+ summ), hsum8 = llama.cpp's hsum_float_8:
//    ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
//    (Its tinyBLAS Q8_0 GEMM for batched logits has the same per-element sequence.)
// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 follow that order bit for bit; the K-quants follow
// llama.cpp's Q8_K order (K super-tiles below); F16/BF16 follow llama.cpp's AVX-512 build
// (float tiles below).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cf {
enum class Isa;  // model/kernels.h
}  // namespace cf

namespace cf::kern {

constexpr size_t kQK = 32;          // elements per Q4_1 / Q8_0 / Q8_1 block
constexpr size_t kQK_K = 256;       // elements per K-quant super-block
constexpr size_t kTileRows = 16;    // output rows interleaved in one repacked tile

// Every block-quantized weight type is repacked at load into a tile layout of 16 output
// rows x one 32-element block (or one 256-element super-block for the K-quants), so that
// a few kernel families serve them all; the values are kept exactly:
//
// Nibble blocks (16 rows x 32 elements of 4 + hb bits), the integer part of the nibble
//   tiles and of the K super-tiles: 4 lines of 64 bytes [64L + 4o + j] (line L: element
//   4L+j of row o in the low nibble, element 16+4L+j in the high; group g = elements
//   4g..4g+3, so line L holds groups L and L+4), then hb lines of the high bits, group g's
//   field at bit (g hb) % 8 of line (g hb) / 8 [256 + 64 line + 4o + j]. hb = 0 for Q4_0,
//   Q4_1, Q4_K; 1 for Q5_0, Q5_1, Q5_K; 2 for Q6_K. Every type keeps the file's width.
// Nibble tiles (nib_geom): one nibble block, then 16 fp16 d and, for Q4_1/Q5_1, 16 fp16 m;
//   320 bytes (Q4_0, Q4_1), 352 (Q5_0), 384 (Q5_1), the file's sizes.
//   Q4_1 / Q5_1: w = d q + m. Q4_0: w = d (q - 8), Q5_0: w = d (q - 16) (the kernel starts
//   each group's sum at -8 or -16 sum(x), from the activation record's corrections).
// Byte tiles (Q8_0: weights stored as uint8 u = q + 128, the unsigned operand of
//   vpdpbusd), bytes [64g + 4o + j], g < 8: element 4g+j of row o.
//   - kByte16 (Q8_0; 544 bytes): then 16 fp16 d: w = d (u - 128).
// Float tiles (F16, BF16 weights; 1024 bytes per 32 k, the file's 2 bytes per weight): the
//   16 rows in quads q = o / 4, each quad's blocks in k order, each block 4 rows x 32 words
//   (row o's words k = 0..31 contiguous, half_word_offset), so that a row's dot product
//   reads whole vectors of k and a quad streams from one address run.
//   Activations are rounded through the weight's type (llama.cpp converts them to F16/BF16,
//   its vec-dot type), kept as floats; BF16's per 32-block as the 16 odd k, then the 16
//   even k (bf16_act_pos), the two operands of the vdpbf16ps step below.
//   The order is that of llama-cpp-python 0.3.36's ggml, AVX-512 build with AVX512-BF16
//   (read from its libggml-cpu.so), and every ISA here computes it (bit-identical y; the
//   one exception, a CPU whose vdpbf16ps is not the two-fma form below, runs the
//   instruction in its AVX-512 kernels, as llama.cpp does there). The order is thus the same
//   on AVX2 as on AVX-512, not that of llama.cpp's AVX2 build (8 lanes, another tree):
//   - from 2 activation rows on, when the matrix's rows are a multiple of 4, tinyBLAS
//     (llamafile_sgemm; it declines n < 2 and m % 4 != 0): per output one 16-lane
//     accumulator; F16: lane k % 16 = fma(w, x, lane) in k order; BF16 (vdpbf16ps): per
//     32-block, lane l takes words 2l+1 then 2l, each a fused multiply-add (its documented
//     order, checked against the instruction on this Xeon); then reduce16.
//   - otherwise ggml_vec_dot_f16 / ggml_vec_dot_bf16 per output: F16: 4 accumulators of
//     16 lanes over each 64 k (k / 16 % 4, lane k % 16), then (a0 + a2) + (a1 + a3) and
//     reduce16; BF16: 2 accumulators (32-block b in b % 2) of the vdpbf16ps step, each
//     reduce16'd, summed in double; k past the last whole 64 adds float(w x) in double.
//   reduce16 is GCC's _mm512_reduce_add_ps: fold the upper half of the lanes onto the lower
//   (l + l+8, then + l+4, + l+2, + l+1). vdpbf16ps also flushes denormal inputs and results
//   to zero; its two-fma form (portable, AVX2, AVX-512 without it, and the AVX-512 GEMM
//   where a start-up check finds the form equal to the instruction, as on this Xeon: it is
//   faster there) does not, which matters only below 2^-126 (never in a model's weights
//   times activations).
constexpr size_t kHalfTileBlock = 1024;
constexpr size_t kHalfQuadBlock = 256;  // one quad's 32-block: 4 rows x 32 words
inline size_t half_word_offset(size_t nb, unsigned o, size_t b, size_t k) {
  return (o / 4) * nb * kHalfQuadBlock + b * kHalfQuadBlock + (o % 4) * 64 + 2 * k;
}
// llama.cpp's tinyBLAS takes F16/BF16 matmuls of at least this many activation rows (when
// the weight's rows are a multiple of 4).
constexpr size_t kHalfGemmRows = 2;
// Where element k (< 32) of a 32-block sits in a BF16 activation record's block.
inline size_t bf16_act_pos(size_t k) { return k % 2 ? k / 2 : 16 + k / 2; }
constexpr size_t kByte16TileBlock = 544;

// Stored (unsigned) value of element e (< 32) of row o of a nibble block with HB high bits.
template <int HB>
inline int nib_block_value(const uint8_t* block, unsigned o, int e) {
  const int g = e / 4, j = e % 4;
  const uint8_t v = block[64 * (g % 4) + 4 * o + j];
  int w = g < 4 ? v & 0xF : v >> 4;
  if constexpr (HB > 0) {
    const int bit = g * HB;
    const uint8_t h = block[256 + 64 * (bit / 8) + 4 * o + j];
    w |= ((h >> (bit % 8)) & ((1 << HB) - 1)) << 4;
  }
  return w;
}

// Which weight interpretation a nibble tile kernel applies (a template parameter of every
// ISA's kernel family), and where its tile keeps what.
enum class NibKind { Q4_1, Q4_0, Q5_1, Q5_0 };
struct NibGeom {
  int high_bits;    // 0 or 1
  size_t d, m;      // byte offsets of the fp16 d and m (m: Q4_1 / Q5_1 only)
  size_t block;     // tile bytes per 32-block
  bool has_min;     // + m * s16
  int start_shift;  // Q4_0 / Q5_0: each group's sum starts at corr >> shift (-8 / -16 sum x)
};
inline constexpr NibGeom nib_geom(NibKind k) {
  switch (k) {
    case NibKind::Q4_1: return {0, 256, 288, 320, true, 0};
    case NibKind::Q4_0: return {0, 256, 0, 320, false, 4};
    case NibKind::Q5_1: return {1, 320, 352, 384, true, 0};
    case NibKind::Q5_0: break;
  }
  return {1, 320, 0, 352, false, 3};
}

// K super-tiles (Q4_K, Q5_K, Q6_K) keep the file's integer form so that the dot is
// llama.cpp's ggml_vec_dot_q{4,5,6}_K_q8_K (AVX2 order) bit for bit: per 256-element
// super-block and 16 rows, 8 blocks of unsigned values, then the sub-block scales as bytes
// [block][row] (Q4_K/Q5_K: uint8 sc and m; Q6_K: int8 sc_lo for elements 0..15 and sc_hi
// for 16..31 of each block), then the file's fp16 d[16] and dmin[16] (Q6_K: d, then 32
// bytes of padding that keep super-tiles 64-byte multiples). Decode streams these bytes
// from memory: as floats they made a Q4_K super-tile 2432 bytes, 5.6% above the file's 2304
// (now 2368: what remains is the scales and mins as whole bytes, not 6-bit fields).
// Each 32-block is a nibble block (above) at the file's width, so that decode, which only
// streams weights, reads no more bytes than llama.cpp does; unpacking the high bits costs a
// few shifts and masks per 64 bytes, which the prefill GEMM spreads over 8 activation rows.
// Per output, per super-block: S_g = sum over blocks of sc * (exact
// dot of group g's 4 elements), and for Q6_K minus 32 * (sc_lo bs16 + sc_hi bs16 of block
// g: llama.cpp 0.3.36's lane of the offset correction), then
// lane[g] = fma(dx * d, float(S_g), lane[g]); Q4_K keeps 4 min lanes fma(-dx * dmin,
// m_2i bs_2i + m_2i+1 bs_2i+1, .) summed as ((0+2)+(1+3)); Q5_K one fma(-dx * dmin,
// sum m_j bs_j, .). Their activations are Q8_K (one float d per 256, llama.cpp's rule).
// That is llama.cpp's order for a matmul of fewer than 8 activation rows (its vec-dot),
// which decode follows; batched rows take the panel GEMM (kernels_panel.h), per-32
// activations and an order of our own.
enum class KQuant { Q4, Q5, Q6 };
struct KTileGeom {
  size_t block;  // bytes of one 32-block's values (16 rows)
  int high_bits; // value bits above the low nibble (0, 1, 2)
  size_t sc, sc_hi, m, d, dmin, bytes;  // byte offsets within one super-tile, and its size
};
inline constexpr KTileGeom ktile_geom(KQuant q) {
  switch (q) {
    case KQuant::Q4: return {256, 0, 2048, 0, 2176, 2304, 2336, 2368};
    case KQuant::Q5: return {320, 1, 2560, 0, 2688, 2816, 2848, 2880};
    case KQuant::Q6: break;
  }
  return {384, 2, 3072, 3200, 0, 3328, 0, 3392};
}
// Weights stream from memory once per generated token, far beyond every cache, and the
// hardware prefetchers stop at each 4 KiB page: the tile kernels ask for the lines
// kStreamPrefetchBytes ahead of the block they are about to read (bench_gemm's
// q6_k/128256/2048/1/2, a 1B model's output matrix: ~1.5x with 8 KiB; 2 and 32 KiB less).
// Past a matrix's end it only touches nothing useful: a prefetch never faults.
constexpr size_t kStreamPrefetchBytes = 8192;
inline void prefetch_ahead(const uint8_t* block, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(block + kStreamPrefetchBytes + i, 0, 3);
}

// Activations quantized to 8 bits per 32-block (llama.cpp's x86 quantize_row_q8_0/1 rule),
// one record per row: int8 qs[32 nb], float d[nb] (the fp16 value as float), float s16[nb]
// = fp16(d_unrounded * sum q) (llama.cpp's Q8_1 s, for Q4_1 and Q5_1), int32 corr[8 nb] =
// -128 * (sum of the 4 q of group g of block b) at [8b + g] (the offset correction of the
// u = q + 128 byte encoding; Q4_0 uses corr / 16 = -8 sum).
struct ActView {
  const uint8_t* base = nullptr;
  size_t stride = 0;  // bytes per row
  size_t nb = 0;      // blocks per row

  const int8_t* qs(size_t r) const { return reinterpret_cast<const int8_t*>(base + r * stride); }
  const float* d(size_t r) const { return reinterpret_cast<const float*>(base + r * stride + nb * kQK); }
  const float* s16(size_t r) const { return d(r) + nb; }
  const int32_t* corr(size_t r) const { return reinterpret_cast<const int32_t*>(d(r) + 2 * nb); }
  const float* xf(size_t r) const { return reinterpret_cast<const float*>(base + r * stride); }  // float tiles
  // Q8_K records (K super-tiles): int8 qs[32 nb], float d[nb / 8], int32 bs16[2 nb] (the
  // sum of each 16 q, llama.cpp's bsums), int32 kpairs[12 nb / 8]: per super-block the bsums
  // again as int16 pairs (lo | hi << 16) for vpmaddwd against the weights' min / offset
  // factors, [0, 4) (bs_2i, bs_2i+1) with bs_j = bs16[2j] + bs16[2j+1] (Q4_K, Q5_K), [4, 12)
  // (bs16[2g], bs16[2g+1]) (Q6_K). Made once per row here, not once per tile in the kernel.
  const float* kd(size_t r) const { return d(r); }
  const int32_t* kbs16(size_t r) const { return reinterpret_cast<const int32_t*>(d(r) + nb / 8); }
  const int32_t* kpairs(size_t r) const { return kbs16(r) + 2 * nb; }
};
inline size_t act_row_stride(size_t nb) { return (nb * (kQK + 8 + 32) + 63) / 64 * 64; }
inline size_t float_act_row_stride(size_t nb) { return nb * kQK * 4; }  // a multiple of 64
inline size_t q8k_act_row_stride(size_t nb) { return (nb * kQK + nb / 8 * 4 + nb * 8 + nb * 6 + 63) / 64 * 64; }
// The writable fields of a Q8_K record of nb 32-blocks at `out`.
struct Q8KRecord {
  int8_t* qs;
  float* d;
  int32_t* bs16;
};
inline Q8KRecord q8k_record(uint8_t* out, size_t nb) {
  const ActView a{out, 0, nb};
  return {reinterpret_cast<int8_t*>(out), const_cast<float*>(a.kd(0)), const_cast<int32_t*>(a.kbs16(0))};
}
// The kpairs of a Q8_K record whose bs16 are written (every ISA's quantize_q8_k ends here).
inline void fill_q8k_pairs(uint8_t* out, size_t nb) {
  const ActView a{out, 0, nb};
  const int32_t* bs = a.kbs16(0);
  auto* p = const_cast<int32_t*>(a.kpairs(0));
  auto pair = [](int32_t lo, int32_t hi) {  // |bsum| <= 32 x 127: exact in int16
    return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFFu) | (static_cast<uint32_t>(hi) << 16));
  };
  for (size_t sb = 0; sb < nb / 8; ++sb, bs += 16, p += 12) {
    for (int i = 0; i < 4; ++i) p[i] = pair(bs[4 * i] + bs[4 * i + 1], bs[4 * i + 2] + bs[4 * i + 3]);
    for (int g = 0; g < 8; ++g) p[4 + g] = pair(bs[2 * g], bs[2 * g + 1]);
  }
}
// llama.cpp's quantize_row_q8_K (its reference rule, which x86 uses) into a Q8_K record.
void quantize_q8_k_record(const float* x, size_t cols, uint8_t* out);
// The same rule for one 256-element block: writes q[256], returns d.
float quantize_q8_k_block(const float* x, int8_t* q);

// Quantizes one row of `cols` floats into an ActView record at `out` (every field).
using QuantizeRowFn = void (*)(const float* x, size_t cols, uint8_t* out);
// One float-tile activation row (round_f16_row's or round_bf16_row's values).
using RoundRowFn = void (*)(const float* x, size_t cols, float* out);

// Computes output lanes [o_lo, o_hi) of one 16-row tile for activation rows
// [r0, r0 + nr): y[(r - r0) * y_stride + o] for o in the tile (y points at lane 0).
using TileKernelFn = void (*)(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr,
                              float* y, size_t y_stride, unsigned o_lo, unsigned o_hi);

// One kernel per (tile layout, weight interpretation).
struct IsaKernels {
  QuantizeRowFn quantize_q8;
  QuantizeRowFn quantize_q8_k;  // Q8_K records (quantize_q8_k_record's values)
  TileKernelFn q4_1, q4_0, q5_1, q5_0;  // nibble tiles (nib_geom)
  TileKernelFn q8_0;                    // kByte16
  TileKernelFn f16, bf16;            // float tiles, vec-dot order (kernels_impl.h)
  TileKernelFn f16_gemm, bf16_gemm;  // the same, tinyBLAS order (kHalfGemmRows on)
  TileKernelFn k4, k5, k6; // K super-tiles (Q4_K, Q5_K, Q6_K), vec-dot order (batched: kernels_panel.h)
  RoundRowFn round_f16, round_bf16;  // float tiles' activations (round_f16_row, round_bf16_row)
};
// The K super-tile kernels of each ISA (kernels_kquant.cpp, kernels_avx2.cpp, kernels_avx512.cpp).
TileKernelFn kquant_tile_portable(KQuant);
TileKernelFn kquant_tile_avx2(KQuant);
TileKernelFn kquant_tile_avx512(KQuant);
// From this many activation rows on, a ByRowCount multiply of block-quantized weights takes
// the panel GEMM (kernels_panel.h; llama.cpp's threshold for its own tiled K-quant GEMM).
constexpr size_t kKQuantBatchedRows = 8;

const IsaKernels& isa_kernels_portable();
const IsaKernels& isa_kernels_avx2();
const IsaKernels& isa_kernels_avx512();
// The table an ISA runs (Amx: AVX-512's; the AMX GEMM is a panel kernel), as
// runtime/runtime_kernels.h's runtime_kernels_for.
const IsaKernels& isa_kernels_for(cf::Isa isa);

// Repacking (kernels_repack.cpp): which tile layout each block-quantized weight type
// takes, the repack of a whole matrix, and row o back as floats (bit-identical to
// dequantize_row of the file's row: the same float operations on the same values).
enum class TileLayout { None, Nib, Byte16, Half, KSuper };
// None: not repacked (F32; F16/BF16 rows that are not whole 32-blocks).
TileLayout tile_layout_for(uint32_t weight_type, size_t cols);
// Bytes per 32 elements of 16 rows (a K super-tile's size / 8).
size_t tile_block_bytes(uint32_t weight_type, TileLayout);
// packed: ceil(rows/16) tiles of nb * tile_block_bytes bytes, written in full (padding
// rows are zero).
void repack_matrix(uint32_t weight_type, const uint8_t* data, size_t rows, size_t cols, uint8_t* packed);
void dequantize_packed_row(uint32_t weight_type, const uint8_t* packed, size_t cols, size_t o, float* dst);
// One activation row for a float tile (cols: whole 32-blocks): x rounded through F16, or
// through BF16 in bf16_act_pos order, as floats. The portable rule; IsaKernels::round_*.
void round_f16_row(const float* x, size_t cols, float* out);
void round_bf16_row(const float* x, size_t cols, float* out);

// llama.cpp's order for float tiles (above), from one weight row and its activation row
// as floats (the activations rounded through the weight's type, in k order): gemm:
// tinyBLAS, else ggml_vec_dot_f16 / _bf16. The portable kernels' definition.
float llama_half_dot(bool bf16, bool gemm, const float* w, const float* x, size_t cols);

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
// 6-bit scale and min j (of 8) from the 12 packed bytes of Q4_K / Q5_K.
inline void k_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
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

// The panel GEMM on AMX (Sapphire Rapids and later): BF16 tiles, TDPBF16PS.
//
// Why BF16 and not the INT8 tiles: every weight type here scales each 32-element block of a
// row by its own factor (and the activations, quantized per 32-block, by theirs), so an INT8
// tile would have to stop every 32 elements to turn its int32 sums into floats: a 16x16x32
// TDPBUSD runs at half the rate of the full 64-byte one (the BF16 rate) and each block then
// costs a float epilogue of 16 vector conversions and FMAs per 16x16 outputs, which ties
// the tile unit to the vector unit's speed. With BF16 the block factors are folded into the
// weights as they are unpacked, the activations need no quantization at all (BF16 keeps 8
// significant bits of every value, where 8-bit blocks keep amax/127 steps), and the tiles
// accumulate in fp32 across the whole row: no epilogue.
//
// Per pair of 16-row weight tiles (kernels.cpp passes tiles in pairs): each tile is unpacked
// into the u8 panel (kernels_panel.h), then into a BF16 "B" panel, 1 KiB per 32-block: row p
// (elements 2p, 2p+1) holds, per output o, the pair w[o][2p], w[o][2p+1] (TDPBF16PS's pair
// layout); w is the dequantized weight (scale (u - offset), or scale u + second) rounded
// once from float to BF16 (round to nearest even). The activations are BF16 rows (x rounded
// to nearest even), stored 16 rows x one 32-block per 1 KiB so that an A tile is one
// contiguous load. The product runs in K slices of 8 blocks: per slice, every 32-row group
// of the task's rows multiplies its two A tiles by the pair's two B tiles (a 2 x 2 block of
// four fp32 accumulator tiles), the slice's B blocks staying in L1 while the groups stream
// past; accumulators go to a per-thread buffer between slices, and the last slice stores
// whole tiles straight into y.
//
// Numerics: not the float sequence of the other ISAs (kernels_panel.h); held to the
// tolerance of docs/ARCHITECTURE.md ("Numerics contract") against the f64 reference.
// TDPBF16PS sums each pair's two products and adds them to the fp32 accumulator, flushing
// denormal inputs and outputs (values below 2^-126: irrelevant at the scales of a model).
//
// The process must hold the tile state permission (arch_prctl(ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA)) before the first tile instruction: kernels.cpp asks for it when it
// detects AMX and only then selects this ISA.
// GCC 12 reports its own _mm512_undefined_* helpers as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "model/kernels_panel.h"

namespace cf::kern {
namespace {

constexpr size_t kBBlock = 1024;  // one 32-block of the BF16 B panel: 16 pair rows x 64 bytes
// The activation records: per group of 16 rows, per 32-block, the 16 rows' 32 BF16 values
// (1 KiB, one A tile, read in one contiguous load); row r of a group at 64 r.
constexpr size_t kABlock = 1024;

// Every tile 16 rows x 64 bytes: C (16 activation rows x 16 fp32 outputs), A (16 rows x 32
// BF16), B (16 pair rows x 16 outputs x 2 BF16).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = 16;
    }
  }
};
static_assert(sizeof(TileConfig) == 64);

// One u8 panel block (kernels_panel.h) into one B block: group g (elements 4g..4g+3 of the
// 16 rows) becomes pair rows 2g and 2g+1.
template <GgmlType T>
inline void b_block(const uint8_t* pb, uint8_t* out) {
  constexpr PanelType P = panel_type(T);
  const __m512 scale = _mm512_load_ps(pb + kPanelScale), second = _mm512_load_ps(pb + kPanelSecond);
  const __m512 off = _mm512_set1_ps(static_cast<float>(P.offset));
  const __m512i bytes = _mm512_set1_epi32(0xFF);
  // Interleaves two 16-lane BF16 halves (lo: elements 2p, hi: 2p+1) into 16 pairs.
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int g = 0; g < 8; ++g) {
    const __m512i v = _mm512_load_si512(pb + 64 * g);
    __m512 w[4];
    for (int j = 0; j < 4; ++j) {
      const __m512 u = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * j), bytes));
      if constexpr (P.kind == PanelKind::Min) w[j] = _mm512_fmadd_ps(scale, u, second);
      else if constexpr (P.kind == PanelKind::Sub16) w[j] = _mm512_mul_ps(g < 4 ? scale : second, _mm512_sub_ps(u, off));
      else w[j] = _mm512_mul_ps(scale, _mm512_sub_ps(u, off));
    }
    for (int h = 0; h < 2; ++h) {
      const __m512i half = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w[2 * h + 1], w[2 * h]));
      _mm512_store_si512(out + 64 * (2 * g + h), _mm512_permutexvar_epi16(pairs, half));
    }
  }
}

// The K slice of a pass: the two tiles' B blocks of a slice (2 x 8 KiB) stay in L1 while
// every 32-row group of the task streams its A blocks past them (measured on a Xeon: 2x2
// tiles over a whole row of 28 blocks, both operands from L2, ran at ~50% of the BF16 peak;
// with the B slice resident ~85%, ~65% counting the accumulators' store and reload per slice).
constexpr size_t kSliceBlocks = 8;

// Two 16-row groups x two tiles (G = 2) or one group (G = 1) over blocks [b0, b1): the four
// (two) accumulators start from c (or zero when b0 == 0) and go back to c, a row-major
// [32 rows][32 outputs] float block.
template <int G>
inline void amx_slice(const uint8_t* bpanel, const uint8_t* act, size_t group_bytes, size_t b0, size_t b1, float* c,
                      float* out, size_t out_stride) {
  constexpr size_t kC = 32 * sizeof(float);  // a C row: 16 outputs of tile 0, then 16 of tile 1
  if (b0 == 0) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (G > 1) {
      _tile_zero(2);
      _tile_zero(3);
    }
  } else {
    _tile_loadd(0, c, kC);
    _tile_loadd(1, c + 16, kC);
    if constexpr (G > 1) {
      _tile_loadd(2, c + 16 * 32, kC);
      _tile_loadd(3, c + 16 * 32 + 16, kC);
    }
  }
  for (size_t b = b0; b < b1; ++b) {
    const uint8_t* a = act + b * kABlock;
    const uint8_t* w = bpanel + 2 * b * kBBlock;
    _tile_loadd(4, a, 64);
    _tile_loadd(6, w, 64);
    _tile_loadd(7, w + kBBlock, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (G > 1) {
      _tile_loadd(5, a + group_bytes, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  if (out) {  // the last slice of whole tiles: straight into y
    const size_t st = out_stride * sizeof(float);
    _tile_stored(0, out, st);
    _tile_stored(1, out + 16, st);
    if constexpr (G > 1) {
      _tile_stored(2, out + 16 * out_stride, st);
      _tile_stored(3, out + 16 * out_stride + 16, st);
    }
    return;
  }
  _tile_stored(0, c, kC);
  _tile_stored(1, c + 16, kC);
  if constexpr (G > 1) {
    _tile_stored(2, c + 16 * 32, kC);
    _tile_stored(3, c + 16 * 32 + 16, kC);
  }
}

inline __mmask16 lane_mask(unsigned lo, unsigned hi) {
  return static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
}

template <GgmlType T>
void amx_pair(const uint8_t* tile0, const uint8_t* tile1, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
              size_t y_stride, unsigned lo0, unsigned hi0, unsigned lo1, unsigned hi1) {
  // B panel: per block, tile 0's 1 KiB then tile 1's (tile 0's again when there is no tile 1:
  // its results are dropped).
  uint8_t* panel = panel_scratch(nb);
  uint8_t* bpanel = thread_scratch(1, 2 * nb * kBBlock);
  for (int i = 0; i < 2; ++i) {
    panel_unpack_tile(T, i == 0 || !tile1 ? tile0 : tile1, nb, panel, [](const uint8_t* src, float* dst) {
      _mm512_storeu_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
    });
    for (size_t b = 0; b < nb; ++b) b_block<T>(panel + b * kPanelBlock, bpanel + (2 * b + i) * kBBlock);
    if (!tile1) break;
  }
  if (!tile1)
    for (size_t b = 0; b < nb; ++b) std::memcpy(bpanel + (2 * b + 1) * kBBlock, bpanel + 2 * b * kBBlock, kBBlock);
  const size_t groups = (nr + 15) / 16;
  const size_t group_bytes = 16 * a.stride;
  float* c = reinterpret_cast<float*>(thread_scratch(2, (groups + 1) / 2 * 32 * 32 * sizeof(float)));
  static const TileConfig config;
  _tile_loadconfig(&config);
  const uint8_t* act = a.base + r0 * a.stride;  // r0: a multiple of 16
  // Whole 32-lane pairs of whole 16-row groups are stored straight into y by the last slice
  // (tile stores overlap the next group's products, where a copy at the end stalled on the
  // output's cache misses: ~35% of the time on a 4864 x 896 matrix); the rest goes through c.
  const bool whole = tile1 && lo0 == 0 && hi0 == 16 && lo1 == 0 && hi1 == 16;
  const size_t direct_groups = whole ? nr / 16 : 0;
  const size_t last = (nb - 1) / kSliceBlocks * kSliceBlocks;
  size_t direct_rows = 0;  // rows [0, direct_rows) went straight into y
  for (size_t b0 = 0; b0 < nb; b0 += kSliceBlocks) {
    const size_t b1 = std::min(nb, b0 + kSliceBlocks);
    for (size_t g = 0; g < groups; g += 2) {
      float* cg = c + g / 2 * 32 * 32;
      const bool two = g + 1 < groups;
      const size_t end = g + (two ? 2 : 1);
      float* out = b0 == last && end <= direct_groups ? y + g * 16 * y_stride : nullptr;
      if (out) direct_rows = 16 * end;
      if (b0 == last) {
        // The next pair's output lines, owned before its tile stores reach them (the output
        // rows are y_stride apart, each store a miss: +12% on a 4864 x 896 matrix).
        for (size_t r = (g + 2) * 16; r < std::min(nr, (g + 4) * 16); ++r) {
          _m_prefetchw(y + r * y_stride);
          _m_prefetchw(y + r * y_stride + 16);
        }
      }
      if (two) amx_slice<2>(bpanel, act + g * group_bytes, group_bytes, b0, b1, cg, out, y_stride);
      else amx_slice<1>(bpanel, act + g * group_bytes, group_bytes, b0, b1, cg, out, y_stride);
    }
  }
  _tile_release();  // the tile state back to its initial (cheap to save) state
  const __mmask16 m0 = lane_mask(lo0, hi0), m1 = tile1 ? lane_mask(lo1, hi1) : 0;
  for (size_t r = direct_rows; r < nr; ++r) {
    _mm512_mask_storeu_ps(y + r * y_stride, m0, _mm512_load_ps(c + r * 32));
    if (m1) _mm512_mask_storeu_ps(y + r * y_stride + 16, m1, _mm512_load_ps(c + r * 32 + 16));
  }
}

template <GgmlType T>
void amx_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
              unsigned o_lo, unsigned o_hi) {
  amx_pair<T>(tile, nullptr, nb, a, r0, nr, y, y_stride, o_lo, o_hi, 0, 0);
}

TilePairFn amx_pair_for(GgmlType t) {
  return panel_kernel_for(t, []<GgmlType T>() { return &amx_pair<T>; });
}

TileKernelFn amx_tile_for(GgmlType t) {
  return panel_kernel_for(t, []<GgmlType T>() { return &amx_tile<T>; });
}

// BF16 values: 64 bytes per row and block, so a 16-row group is 16 stride bytes.
size_t amx_row_stride(size_t nb) { return nb * kQK * 2; }

// Row r, x rounded to BF16 (nearest even), into its group's blocks (kABlock); the weight
// type does not change the record.
void amx_quantize_row(const float* x, size_t cols, uint8_t* records, size_t r, size_t stride, PanelType) {
  uint8_t* out = records + r / 16 * 16 * stride + r % 16 * 64;
  for (size_t k = 0; k < cols; k += 32, out += kABlock) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
    _mm512_storeu_si512(out, reinterpret_cast<__m512i>(v));
  }
}

}  // namespace

const PanelKernels& panel_kernels_amx() {
  // 512 rows per task: the unpacking of each tile pair is shared by 512 rows (measured on a
  // 4864 x 896 Q5_0 matrix, 2048 rows, one thread: 315, 357, 432 G MAC/s at 128, 256, 512).
  static const PanelKernels k{amx_quantize_row, amx_tile_for, amx_pair_for, amx_row_stride, 16, 512};
  return k;
}

}  // namespace cf::kern

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

#include "model/amx_tiles.h"
#include "model/kernels_panel.h"

namespace cf::kern {
namespace {

constexpr size_t kBBlock = 1024;  // one 32-block of the BF16 B panel: 16 pair rows x 64 bytes
// The activation records: per group of 16 rows, per 32-block, the 16 rows' 32 BF16 values
// (1 KiB, one A tile, read in one contiguous load); row r of a group at 64 r.
constexpr size_t kABlock = 1024;

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
// Tried on a Xeon, 2026-12-03, and no faster on Qwen 0.5B and Gemma 3: 12 or 16 blocks a
// slice, and one 16-row group x four tiles per product (half the A tile loads from L2; Q4_K
// and Q6_K 10-15% slower, Q5_0 5-10% faster, whole prefills equal).
constexpr size_t kSliceBlocks = 8;

// Two 16-row groups x two tiles (G = 2) or one group (G = 1) over blocks [b0, b1): the four
// (two) accumulators start from c (or zero when b0 == 0) and go back to c, a row-major
// [32 rows][32 outputs] float block.
template <int G>
inline void amx_slice(const uint8_t* bslice, const uint8_t* act, size_t group_bytes, size_t blocks, bool first, float* c,
                      float* out, size_t out_stride) {
  constexpr size_t kC = 32 * sizeof(float);  // a C row: 16 outputs of tile 0, then 16 of tile 1
  if (first) {
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
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* a = act + b * kABlock;
    const uint8_t* w = bslice + 2 * b * kBBlock;
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

// Tiles per pass of amx_range: their accumulators (rows x 16 x kPassTiles floats, 512 KiB at
// 512 rows) stay in L2 beside the activations' K slice.
constexpr size_t kPassTiles = 16;

// Tiles [0, count) of a task (each tile_bytes, nb blocks), activation rows [r0, r0 + nr):
// lanes [lo, 16) of the first tile, [0, hi) of the last, every lane of the rest; y at lane 0
// of the first tile. In passes of kPassTiles tiles; per pass the K slices are the outer
// loop, so that a slice of the activations (nr rows x 8 blocks, 256 KiB at 512 rows) is read
// from L2 by every tile pair of the pass, where a whole row of activations (up to 5 MiB for
// a 4864-column matrix) came from L3 once per pair. Each pair's B slice is unpacked when
// the slice reaches it (the same total unpacking as whole tiles).
template <GgmlType T>
void amx_range(const uint8_t* tiles, size_t tile_bytes, size_t count, size_t nb, const ActView& a, size_t r0,
               size_t nr, float* y, size_t y_stride, unsigned lo, unsigned hi) {
  const size_t block_bytes = tile_bytes / nb;  // a K super-tile is 8 blocks of this
  const size_t groups = (nr + 15) / 16, group_pairs = (groups + 1) / 2;
  const size_t group_bytes = 16 * a.stride;
  constexpr size_t kPairC = 32 * 32;  // floats of one pair x one group pair
  uint8_t* panel = panel_scratch(kSliceBlocks);
  uint8_t* bslice = thread_scratch(1, 2 * kSliceBlocks * kBBlock);
  float* c = reinterpret_cast<float*>(thread_scratch(2, kPassTiles / 2 * group_pairs * kPairC * sizeof(float)));
  const uint8_t* act = a.base + r0 * a.stride;  // r0: a multiple of 16
  const size_t last = (nb - 1) / kSliceBlocks * kSliceBlocks;
  static const AmxTileConfig config;
  _tile_loadconfig(&config);
  for (size_t p0 = 0; p0 < count; p0 += kPassTiles) {
    const size_t pass = std::min(kPassTiles, count - p0), pairs = (pass + 1) / 2;
    // Outputs of the pass's pairs that go straight to y from the last slice: whole tiles of
    // whole 16-row groups; the rest through c.
    auto whole_pair = [&](size_t q) {
      const size_t t = p0 + 2 * q;
      return t + 1 < count && (t > 0 || lo == 0) && (t + 2 < count || hi == 16);
    };
    for (size_t b0 = 0; b0 < nb; b0 += kSliceBlocks) {
      const size_t b1 = std::min(nb, b0 + kSliceBlocks), sb = b1 - b0;
      for (size_t q = 0; q < pairs; ++q) {
        const size_t t = p0 + 2 * q;
        const bool two = t + 1 < count;
        for (int i = 0; i < 2; ++i) {  // B slice: per block, tile t's 1 KiB, then tile t + 1's (or t's again)
          if (i == 1 && !two) {
            for (size_t b = 0; b < sb; ++b) std::memcpy(bslice + (2 * b + 1) * kBBlock, bslice + 2 * b * kBBlock, kBBlock);
            break;
          }
          panel_unpack_tile(T, tiles + (t + i) * tile_bytes + b0 * block_bytes, sb, panel,
                            [](const uint8_t* src, float* dst) {
                              _mm512_storeu_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
                            });
          for (size_t b = 0; b < sb; ++b) b_block<T>(panel + b * kPanelBlock, bslice + (2 * b + i) * kBBlock);
        }
        const bool direct_pair = b0 == last && whole_pair(q);
        float* yq = y + t * 16;
        for (size_t g = 0; g < groups; g += 2) {
          const bool two_groups = g + 1 < groups;
          float* cg = c + (q * group_pairs + g / 2) * kPairC;
          float* out = direct_pair && g + (two_groups ? 2 : 1) <= nr / 16 ? yq + g * 16 * y_stride : nullptr;
          if (b0 == last && direct_pair) {
            // The next group pair's output lines, owned before its tile stores reach them
            // (the rows are y_stride apart, each store a miss: +12% on a 4864 x 896 matrix).
            for (size_t r = (g + 2) * 16; r < std::min(nr, (g + 4) * 16); ++r) {
              __builtin_prefetch(yq + r * y_stride, 1, 3);  // prefetchw (-mprfchw)
              __builtin_prefetch(yq + r * y_stride + 16, 1, 3);
            }
          }
          const uint8_t* ag = act + g * group_bytes + b0 * kABlock;
          if (two_groups) amx_slice<2>(bslice, ag, group_bytes, sb, b0 == 0, cg, out, y_stride);
          else amx_slice<1>(bslice, ag, group_bytes, sb, b0 == 0, cg, out, y_stride);
        }
      }
    }
    // What did not go straight to y: from c, masked.
    for (size_t q = 0; q < pairs; ++q) {
      const size_t t = p0 + 2 * q;
      // The rows amx_slice stored straight into y: whole group pairs, and a last single
      // group when it is whole (the `out` condition above).
      const size_t full = nr / 16;
      const size_t direct_rows = !whole_pair(q) ? 0 : groups % 2 == 1 && full == groups ? nr : full / 2 * 32;
      const bool two = t + 1 < count;
      const __mmask16 m0 = lane_mask(t == 0 ? lo : 0, t + 1 == count ? hi : 16);
      const __mmask16 m1 = two ? lane_mask(0, t + 2 == count ? hi : 16) : 0;
      float* yq = y + t * 16;
      for (size_t r = direct_rows; r < nr; ++r) {
        const float* cr = c + (q * group_pairs + r / 32) * kPairC + r % 32 * 32;
        _mm512_mask_storeu_ps(yq + r * y_stride, m0, _mm512_load_ps(cr));
        if (m1) _mm512_mask_storeu_ps(yq + r * y_stride + 16, m1, _mm512_load_ps(cr + 16));
      }
    }
  }
  _tile_release();  // the tile state back to its initial (cheap to save) state
}

TileRangeFn amx_range_for(GgmlType t) {
  return panel_kernel_for(t, []<GgmlType T>() { return &amx_range<T>; });
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
  static const PanelKernels k{amx_quantize_row, nullptr, amx_range_for, amx_row_stride, 16, 512};
  return k;
}

}  // namespace cf::kern

// Repacking every block-quantized weight type into the tile layouts of kernels_impl.h.
// Each file block is first decoded into one neutral form per 32 elements (stored integer
// values and their scales), read off the reference dequantizers in kernels_ref.cpp, then
// written into the tile of its 16 output rows. The values are kept exactly and at the
// file's width (nibble blocks with high-bit lines; Q8_0 as bytes); fp16 scales are kept as
// fp16, or as floats where a kernel wants them so (exact).
#include <cstring>
#include <stdexcept>
#include <string>

#include "model/ggml_type.h"
#include "model/kernels.h"
#include "model/kernels_impl.h"

namespace cf::kern {
namespace {

// One 32-element block of one row in neutral form: u[j] is the stored value (0..15 or
// 0..31 for nibble layouts; q + 128 for byte layouts), and the file's fp16 scales.
struct Block32 {
  uint8_t u[32];
  uint16_t d16 = 0, m16 = 0;
};

inline float h2f(const uint8_t* p) { return fp16_to_fp32(load_u16(p)); }

// 5-bit value j of a Q5_0/Q5_1 block: low nibble from qs, fifth bit from qh.
inline int q5_value(const uint8_t* qs, uint32_t qh, int j) {
  return j < 16 ? ((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) : ((qs[j - 16] >> 4) | (((qh >> j) & 1) << 4));
}

// Block b (32 elements) of a row of `type` starting at `row`.
void decode_block(GgmlType type, const uint8_t* row, size_t b, Block32& out) {
  switch (type) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: {
      const bool q41 = type == GgmlType::Q4_1;
      const uint8_t* blk = row + b * (q41 ? 20 : 18);
      const uint8_t* qs = blk + (q41 ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        out.u[j] = qs[j] & 0xF;
        out.u[j + 16] = qs[j] >> 4;
      }
      out.d16 = load_u16(blk);
      out.m16 = q41 ? load_u16(blk + 2) : 0;
      return;
    }
    case GgmlType::Q8_0: {
      const uint8_t* blk = row + b * 34;
      for (int j = 0; j < 32; ++j) out.u[j] = static_cast<uint8_t>(blk[2 + j] ^ 0x80);
      out.d16 = load_u16(blk);
      return;
    }
    case GgmlType::Q5_0: case GgmlType::Q5_1: {  // Q5_0: w = d (q - 16); Q5_1: w = d q + m
      const bool q51 = type == GgmlType::Q5_1;
      const uint8_t* blk = row + b * (q51 ? 24 : 22);
      uint32_t qh;
      std::memcpy(&qh, blk + (q51 ? 4 : 2), 4);
      for (int j = 0; j < 32; ++j) out.u[j] = static_cast<uint8_t>(q5_value(blk + (q51 ? 8 : 6), qh, j));
      out.d16 = load_u16(blk);
      out.m16 = q51 ? load_u16(blk + 2) : 0;
      return;
    }
    default: throw std::invalid_argument("repack: no tile layout for " + std::string(ggml_type_name(type)));
  }
}

// Writes the 32 values u (4 + hb bits) as row o of the nibble block at dst (kernels_impl.h;
// dst starts zeroed).
void pack_nib_block(const uint8_t* u, int hb, unsigned o, uint8_t* dst) {
  for (int line = 0; line < 4; ++line)
    for (int j = 0; j < 4; ++j)
      dst[64 * line + 4 * o + j] = static_cast<uint8_t>((u[4 * line + j] & 0xF) | ((u[16 + 4 * line + j] & 0xF) << 4));
  for (int g = 0; g < 8 && hb > 0; ++g)
    for (int j = 0; j < 4; ++j) {
      const int bit = g * hb;
      dst[256 + 64 * (bit / 8) + 4 * o + j] |= static_cast<uint8_t>((u[4 * g + j] >> 4) << (bit % 8));
    }
}

NibKind nib_kind_of(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return NibKind::Q4_0;
    case GgmlType::Q5_1: return NibKind::Q5_1;
    case GgmlType::Q5_0: return NibKind::Q5_0;
    default: return NibKind::Q4_1;
  }
}

// Writes `blk` of a `type` row as lane o of the tile block at dst.
void pack_block(GgmlType type, TileLayout layout, const Block32& blk, unsigned o, uint8_t* dst) {
  switch (layout) {
    case TileLayout::Nib: {
      const NibGeom g = nib_geom(nib_kind_of(type));
      pack_nib_block(blk.u, g.high_bits, o, dst);
      std::memcpy(dst + g.d + 2 * o, &blk.d16, 2);
      if (g.has_min) std::memcpy(dst + g.m + 2 * o, &blk.m16, 2);
      return;
    }
    case TileLayout::Byte16:
      for (int g = 0; g < 8; ++g) std::memcpy(dst + 64 * g + 4 * o, blk.u + 4 * g, 4);
      std::memcpy(dst + 512 + 2 * o, &blk.d16, 2);
      return;
    default: break;
  }
  throw std::logic_error("pack_block: not a block-quantized layout");
}

// One super-block (256 elements) of one row of a K-quant in integer form: the unsigned
// stored values, the sub-block scales (Q6_K: one per 16 elements, signed) and mins, and
// the fp16 super-block scales as floats.
struct KBlock {
  uint8_t u[256];
  int sc[16];
  uint8_t m[8];
  uint16_t d = 0, dmin = 0;  // fp16, as in the file
};

void decode_kblock(GgmlType type, const uint8_t* row, size_t sb, KBlock& out) {
  switch (type) {
    case GgmlType::Q4_K: case GgmlType::Q5_K: {
      const bool q5 = type == GgmlType::Q5_K;
      const uint8_t* blk = row + sb * (q5 ? 176 : 144);
      const uint8_t* qh = blk + 16;
      for (int j = 0; j < 8; ++j) {  // sub-block j: nibbles of bytes [32 (j/2), +32), low for even j
        const uint8_t* ql = blk + (q5 ? 48 : 16) + 32 * (j / 2);
        const uint8_t bit = static_cast<uint8_t>(1u << j);  // Q5_K: fifth bit of sub-block j
        for (int l = 0; l < 32; ++l) {
          const int low = (j & 1) ? ql[l] >> 4 : ql[l] & 0xF;
          out.u[32 * j + l] = static_cast<uint8_t>(low + (q5 && (qh[l] & bit) ? 16 : 0));
        }
        uint8_t sc, mn;
        k_scale_min(j, blk + 4, sc, mn);
        out.sc[j] = sc;
        out.m[j] = mn;
      }
      out.d = load_u16(blk);
      out.dmin = load_u16(blk + 2);
      return;
    }
    case GgmlType::Q6_K: {
      const uint8_t* blk = row + sb * 210;
      for (int e = 0; e < 256; ++e) {
        const int half = e / 128, quarter = e % 128 / 32, l = e % 32;
        const uint8_t* ql = blk + 64 * half + (quarter & 1 ? 32 : 0);
        const uint8_t qh = blk[128 + 32 * half + l];
        const int low = quarter < 2 ? ql[l] & 0xF : ql[l] >> 4;
        out.u[e] = static_cast<uint8_t>(low | (((qh >> (2 * quarter)) & 3) << 4));
      }
      for (int i = 0; i < 16; ++i) out.sc[i] = static_cast<int8_t>(blk[192 + i]);
      out.d = load_u16(blk + 208);
      return;
    }
    default: throw std::invalid_argument("repack: not a K-quant: " + std::string(ggml_type_name(type)));
  }
}

KQuant kquant_of(GgmlType t) {
  return t == GgmlType::Q4_K ? KQuant::Q4 : t == GgmlType::Q5_K ? KQuant::Q5 : KQuant::Q6;
}

// Writes `kb` as row o of the super-tile at dst (layout in kernels_impl.h).
void pack_kblock(KQuant q, const KBlock& kb, unsigned o, uint8_t* dst) {
  const KTileGeom g = ktile_geom(q);
  for (int c = 0; c < 8; ++c) {
    pack_nib_block(kb.u + 32 * c, g.high_bits, o, dst + g.block * c);  // zeroed by repack_matrix
    if (q == KQuant::Q6) {
      dst[g.sc + 16 * c + o] = static_cast<uint8_t>(kb.sc[2 * c]);
      dst[g.sc_hi + 16 * c + o] = static_cast<uint8_t>(kb.sc[2 * c + 1]);
    } else {
      dst[g.sc + 16 * c + o] = static_cast<uint8_t>(kb.sc[c]);
      dst[g.m + 16 * c + o] = kb.m[c];
    }
  }
  std::memcpy(dst + g.d + 2 * o, &kb.d, 2);
  if (q != KQuant::Q6) std::memcpy(dst + g.dmin + 2 * o, &kb.dmin, 2);
}

}  // namespace

TileLayout tile_layout_for(uint32_t weight_type, size_t cols) {
  switch (static_cast<GgmlType>(weight_type)) {
    case GgmlType::F16: case GgmlType::BF16: return cols % kQK == 0 ? TileLayout::Half : TileLayout::None;
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: return TileLayout::Nib;
    case GgmlType::Q8_0: return TileLayout::Byte16;
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return TileLayout::KSuper;
    default: return TileLayout::None;
  }
}

size_t tile_block_bytes(uint32_t weight_type, TileLayout layout) {
  switch (layout) {
    case TileLayout::KSuper: return ktile_geom(kquant_of(static_cast<GgmlType>(weight_type))).bytes / 8;
    case TileLayout::Nib: return nib_geom(nib_kind_of(static_cast<GgmlType>(weight_type))).block;
    case TileLayout::Byte16: return kByte16TileBlock;
    case TileLayout::Half: return kHalfTileBlock;
    case TileLayout::None: break;
  }
  return 0;
}

void repack_matrix(uint32_t weight_type, const uint8_t* data, size_t rows, size_t cols, uint8_t* packed) {
  const auto type = static_cast<GgmlType>(weight_type);
  const TileLayout layout = tile_layout_for(weight_type, cols);
  const size_t tb = tile_block_bytes(weight_type, layout), nb = cols / kQK;
  const size_t n_tiles = (rows + kTileRows - 1) / kTileRows;
  const size_t row_bytes = ggml_row_bytes(type, cols);
  std::memset(packed, 0, n_tiles * nb * tb);  // padding rows: zero scales, so zero output
  if (layout == TileLayout::KSuper) {
    const KQuant q = kquant_of(type);
    const size_t sb_bytes = ktile_geom(q).bytes, nsb = nb / 8;
    KBlock kb;
    for (size_t o = 0; o < rows; ++o)
      for (size_t sb = 0; sb < nsb; ++sb) {
        decode_kblock(type, data + o * row_bytes, sb, kb);
        pack_kblock(q, kb, static_cast<unsigned>(o % kTileRows), packed + (o / kTileRows) * nb * tb + sb * sb_bytes);
      }
    return;
  }
  if (layout == TileLayout::Half) {  // each row's 32-word blocks, placed by half_word_offset
    for (size_t o = 0; o < rows; ++o) {
      const uint8_t* src = data + o * row_bytes;
      uint8_t* tile = packed + (o / kTileRows) * nb * tb;
      const auto lane = static_cast<unsigned>(o % kTileRows);
      for (size_t b = 0; b < nb; ++b) std::memcpy(tile + half_word_offset(nb, lane, b, 0), src + 2 * b * kQK, 2 * kQK);
    }
    return;
  }
  Block32 blk;
  for (size_t o = 0; o < rows; ++o) {
    const size_t t = o / kTileRows;
    const auto lane = static_cast<unsigned>(o % kTileRows);
    for (size_t b = 0; b < nb; ++b) {
      decode_block(type, data + o * row_bytes, b, blk);
      pack_block(type, layout, blk, lane, packed + (t * nb + b) * tb);
    }
  }
}

void dequantize_packed_row(uint32_t weight_type, const uint8_t* packed, size_t cols, size_t o, float* dst) {
  const auto type = static_cast<GgmlType>(weight_type);
  const TileLayout layout = tile_layout_for(weight_type, cols);
  const size_t tb = tile_block_bytes(weight_type, layout), nb = cols / kQK;
  const unsigned lane = static_cast<unsigned>(o % kTileRows);
  const uint8_t* tile = packed + (o / kTileRows) * nb * tb;
  if (layout == TileLayout::KSuper) {  // the same float operations as kernels_ref.cpp
    const KQuant q = kquant_of(type);
    const KTileGeom g = ktile_geom(q);
    for (size_t sb = 0; sb < nb / 8; ++sb) {
      const uint8_t* t = tile + sb * g.bytes;
      const float d = h2f(t + g.d + 2 * lane);
      for (int e = 0; e < 256; ++e) {
        const int c = e / 32, l = e % 32;
        float* out = dst + sb * kQK_K + e;
        const uint8_t* blk = t + g.block * c;
        const int w = g.high_bits == 0 ? nib_block_value<0>(blk, lane, l)
                      : g.high_bits == 1 ? nib_block_value<1>(blk, lane, l)
                                         : nib_block_value<2>(blk, lane, l);
        if (q != KQuant::Q6) {
          *out = d * t[g.sc + 16 * c + lane] * static_cast<float>(w) - h2f(t + g.dmin + 2 * lane) * t[g.m + 16 * c + lane];
        } else {
          const auto sc = static_cast<int8_t>(t[(l < 16 ? g.sc : g.sc_hi) + 16 * c + lane]);
          *out = d * sc * static_cast<float>(w - 32);
        }
      }
    }
    return;
  }
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* src = tile + b * tb;
    float* y = dst + b * kQK;
    if (layout == TileLayout::Half) {
      for (size_t k = 0; k < kQK; ++k) {
        const uint16_t v = load_u16(tile + half_word_offset(nb, lane, b, k));
        y[k] = type == GgmlType::F16 ? fp16_to_fp32(v) : bf16_to_fp32(v);
      }
      continue;
    }
    // The same float operations as kernels_ref.cpp's dequantizers, on the same values.
    if (layout == TileLayout::Nib) {
      const NibGeom g = nib_geom(nib_kind_of(type));
      const float d = h2f(src + g.d + 2 * lane), m = g.has_min ? h2f(src + g.m + 2 * lane) : 0.0f;
      for (int e = 0; e < 32; ++e) {
        const int q = g.high_bits ? nib_block_value<1>(src, lane, e) : nib_block_value<0>(src, lane, e);
        switch (type) {
          case GgmlType::Q4_0: y[e] = static_cast<float>(q - 8) * d; break;
          case GgmlType::Q5_0: y[e] = static_cast<float>(q - 16) * d; break;
          default: y[e] = static_cast<float>(q) * d + m; break;  // Q4_1, Q5_1
        }
      }
    } else {
      for (int e = 0; e < 32; ++e)
        y[e] = static_cast<float>(static_cast<int>(src[64 * (e / 4) + 4 * lane + e % 4]) - 128) * h2f(src + 512 + 2 * lane);
    }
  }
}

void round_f16_row(const float* x, size_t cols, float* out) {
  for (size_t i = 0; i < cols; ++i) out[i] = fp16_round(x[i]);
}
void round_bf16_row(const float* x, size_t cols, float* out) {
  for (size_t i = 0; i < cols; ++i) out[i / kQK * kQK + bf16_act_pos(i % kQK)] = bf16_to_fp32(fp32_to_bf16(x[i]));
}

}  // namespace cf::kern

// AVX2 kernels over the same repacked tiles as AVX-512: a tile is processed as two halves
// of 8 rows (one ymm of 8 x 4 k-bytes), one float accumulator per 4-element group (the
// order of kernels_impl.h). Without VNNI the byte dot is maddubs + madd:
// Q4_1 nibbles are unsigned as is; Q8_0 uses |w| x sign(x, w) so that int16 pair sums
// cannot saturate. Integer sums and the per-lane float sequence equal the portable ones.
// GCC 12 reports its own _mm512_undefined_* helpers as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "model/kernels_impl.h"

namespace cf::kern {
namespace {

inline float fp16_round_f16c(float f) {
  return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// A thread's buffer for unpacked half tiles (the tile kernels run on the pool's threads).
uint8_t* unpack_scratch(size_t bytes) {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<uint8_t, Free> buf;
  thread_local size_t cap = 0;
  if (bytes > cap) {
    cap = (bytes + 63) / 64 * 64;
    buf.reset(static_cast<uint8_t*>(std::aligned_alloc(64, cap)));
    if (!buf) throw std::bad_alloc();
  }
  return buf.get();
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline int hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

void quantize_q8_avx2(const float* x, size_t cols, uint8_t* out) {
  const size_t nb = cols / kQK;
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* dv = reinterpret_cast<float*>(out + nb * kQK);
  float* s16 = dv + nb;
  int32_t* cv = reinterpret_cast<int32_t*>(dv + 2 * nb);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (size_t b = 0; b < nb; ++b) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + b * kQK + 8 * i);
    __m256 mx = _mm256_andnot_ps(sign, v[0]);
    for (int i = 1; i < 4; ++i) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
    const float amax = hmax8(mx);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 mul = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const int sum = hsum8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kQK), p);
    dv[b] = fp16_round_f16c(d);
    s16[b] = fp16_round_f16c(d * static_cast<float>(sum));
    // corr: -128 x each group's sum of 4 q (maddubs with 1s: pair sums; madd: group sums)
    const __m256i groups = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cv + 8 * b), _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(groups, 7)));
  }
}

// quantize_q8_k_record (kernels_kquant.cpp) 8 lanes at a time, the same values: the value
// of largest magnitude is the first one in order (its sign sets the scale's), and
// q = round-half-even(iscale * x), capped at 127 (the portable loop ran a K-quant decode's
// activations one value at a time).
void quantize_q8_k_avx2(const float* x, size_t cols, uint8_t* out) {
  const size_t nb = cols / kQK;
  const auto [qs, dv, bs16] = q8k_record(out, nb);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (size_t sb = 0; sb < nb / 8; ++sb) {
    const float* xs = x + sb * kQK_K;
    int8_t* q = qs + sb * kQK_K;
    __m256 mx = _mm256_setzero_ps();
    for (size_t i = 0; i < kQK_K; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(xs + i)));
    const float amax = hmax8(mx);
    if (amax == 0.0f) {
      std::memset(q, 0, kQK_K);
      std::memset(bs16 + 16 * sb, 0, 16 * sizeof(int32_t));
      dv[sb] = 0.0f;
      continue;
    }
    float max = amax;
    for (size_t i = 0; i < kQK_K; i += 8) {
      const int hit = _mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xs + i)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
      if (hit) {
        max = xs[i + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 mul = _mm256_set1_ps(iscale);
    for (size_t i = 0; i < kQK_K; i += 32) {
      __m256i v[4];
      for (int k = 0; k < 4; ++k)
        v[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(mul, _mm256_loadu_ps(xs + i + 8 * k)),
                                                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
                                _mm256_set1_epi32(127));
      __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
      p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), p);
      bs16[16 * sb + i / 16] = hsum8(_mm256_add_epi32(v[0], v[1]));
      bs16[16 * sb + i / 16 + 1] = hsum8(_mm256_add_epi32(v[2], v[3]));
    }
    dv[sb] = 1.0f / iscale;
  }
  fill_q8k_pairs(out, nb);
}

inline __m256i bcast32(const int8_t* p) { return _mm256_set1_epi32(load_i32(p)); }

inline __m256 hsum8_lanes(const __m256 l[8]) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
                       _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
}

inline __m256 load8_fp16(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The 8 groups of weight values of a nibble block with HB high-bit lines (kernels_impl.h)
// for rows 8h..8h+7 (the 32-byte half of each 64-byte line): nibbles, with the high-bit
// fields shifted to bits 4.. and masked (the shift is 16-bit; the mask drops what crossed
// from the neighbouring byte).
template <int HB>
inline void nib_block_half(const uint8_t* blk, int h, __m256i w[8]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i high_mask = _mm256_set1_epi8(static_cast<char>(((1 << HB) - 1) << 4));
  __m256i qh[2];
  for (int i = 0; i < HB; ++i) qh[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 256 + 64 * i + 32 * h));
  for (int g = 0; g < 8; ++g) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * (g % 4) + 32 * h));
    w[g] = _mm256_and_si256(g < 4 ? v : _mm256_srli_epi16(v, 4), low4);
    if constexpr (HB > 0) {
      const int bit = g * HB % 8;
      const __m256i x = qh[g * HB / 8];
      const __m256i placed = bit < 4 ? _mm256_slli_epi16(x, 4 - bit) : bit > 4 ? _mm256_srli_epi16(x, bit - 4) : x;
      w[g] = _mm256_or_si256(w[g], _mm256_and_si256(placed, high_mask));
    }
  }
}

// Nibble and byte tiles, a pair of groups (L and L+4: the low and high nibbles of one
// 64-byte line of a nibble block) at a time. Signed weights (Q4_0 / Q5_0 as q - 8 / q - 16,
// Q8_0 as u - 128) multiply as |w| x sign(x, w): the exact integer dot, as the correction
// term gives it elsewhere, and int16 pair sums cannot saturate (|w| <= 128, |x| <= 127).
enum class PairKind { Q4_1, Q4_0, Q5_1, Q5_0, Q8_0 };
template <PairKind P>
struct PairTraits {
  static constexpr bool kNib = P != PairKind::Q8_0;
  static constexpr NibKind kK = P == PairKind::Q4_1 ? NibKind::Q4_1 : P == PairKind::Q4_0 ? NibKind::Q4_0
                                : P == PairKind::Q5_1 ? NibKind::Q5_1 : NibKind::Q5_0;
  static constexpr NibGeom kG = nib_geom(kK);
  static constexpr bool kSigned = P == PairKind::Q4_0 || P == PairKind::Q5_0 || P == PairKind::Q8_0;
  static constexpr bool kMin = kNib && kG.has_min;
  static constexpr size_t kBlock = kNib ? kG.block : kByte16TileBlock;
  static constexpr size_t kD = kNib ? kG.d : 512;
  static constexpr int kOffset = P == PairKind::Q4_0 ? 8 : P == PairKind::Q5_0 ? 16 : 0;
};

// Groups L and L+4 of block `wb` for rows 8h..8h+7: the weight values (signed kinds:
// already less their offset).
template <PairKind P>
inline void load_pair(const uint8_t* wb, int h, int L, __m256i& w0, __m256i& w1) {
  using T = PairTraits<P>;
  if constexpr (!T::kNib) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    w0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * L + 32 * h)), flip);
    w1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * (L + 4) + 32 * h)), flip);
  } else {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * L + 32 * h));
    w0 = _mm256_and_si256(v, low4);
    w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    if constexpr (T::kG.high_bits == 1) {  // group g's bit at bit g of line 0: to bit 4
      const __m256i hb = _mm256_set1_epi8(0x10);
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256 + 32 * h));
      const __m256i p0 = L == 0 ? _mm256_slli_epi16(x, 4) : L == 1 ? _mm256_slli_epi16(x, 3)
                         : L == 2 ? _mm256_slli_epi16(x, 2) : _mm256_slli_epi16(x, 1);
      const __m256i p1 = L == 0 ? x : L == 1 ? _mm256_srli_epi16(x, 1) : L == 2 ? _mm256_srli_epi16(x, 2)
                                                                      : _mm256_srli_epi16(x, 3);
      w0 = _mm256_or_si256(w0, _mm256_and_si256(p0, hb));
      w1 = _mm256_or_si256(w1, _mm256_and_si256(p1, hb));
    }
    if constexpr (T::kSigned) {
      w0 = _mm256_sub_epi8(w0, _mm256_set1_epi8(T::kOffset));
      w1 = _mm256_sub_epi8(w1, _mm256_set1_epi8(T::kOffset));
    }
  }
}

// The exact dot of one group (8 rows x 4 elements) with 4 activation bytes at q.
template <bool Signed>
inline __m256i group_dot(__m256i w, __m256i wabs, const int8_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (Signed)
    return _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(bcast32(q), w)), ones);
  else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, bcast32(q)), ones);
}

// One activation row (decode), all 16 rows of the tile: per half 8 accumulators (one per
// group), in one pass over the blocks, each line unpacked as it is used. Decode streams the
// tile from memory once, so both halves of kVecChunk blocks are done while they are in L1:
// a pass per half over the row left the memory idle in the second (the prefetches run
// ahead only in the first).
constexpr size_t kVecChunk = 8;
template <PairKind P>
void pair_vec(const uint8_t* tile, size_t nb, const ActView& a, size_t r, float* out) {
  using T = PairTraits<P>;
  __m256 acc[2][8];
  for (int h = 0; h < 2; ++h)
    for (int g = 0; g < 8; ++g) acc[h][g] = _mm256_setzero_ps();
  const int8_t* xq = a.qs(r);
  const float* xd = a.d(r);
  for (size_t b0 = 0; b0 < nb; b0 += kVecChunk) {
    const size_t b1 = std::min(nb, b0 + kVecChunk);
    for (int h = 0; h < 2; ++h) {
      __m256 l[8];
      for (int g = 0; g < 8; ++g) l[g] = acc[h][g];
      for (size_t b = b0; b < b1; ++b) {
        const uint8_t* wb = tile + b * T::kBlock;
        if (h == 0) prefetch_ahead(wb, T::kBlock);
        const __m256 dd = _mm256_mul_ps(load8_fp16(wb + T::kD + 16 * h), _mm256_set1_ps(xd[b]));
        for (int L = 0; L < 4; ++L) {
          __m256i w0, w1;
          load_pair<P>(wb, h, L, w0, w1);
          __m256i a0 = w0, a1 = w1;
          if constexpr (T::kSigned) {
            a0 = _mm256_abs_epi8(w0);
            a1 = _mm256_abs_epi8(w1);
          }
          const int8_t* q = xq + b * kQK + 4 * L;
          l[L] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(group_dot<T::kSigned>(w0, a0, q)), l[L]);
          l[L + 4] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(group_dot<T::kSigned>(w1, a1, q + 16)), l[L + 4]);
        }
      }
      for (int g = 0; g < 8; ++g) acc[h][g] = l[g];
    }
  }
  for (int h = 0; h < 2; ++h) {
    __m256 res = hsum8_lanes(acc[h]);
    if constexpr (T::kMin) {
      const float* xs = a.s16(r);
      __m256 summ = _mm256_setzero_ps();
      for (size_t b = 0; b < nb; ++b)
        summ = _mm256_fmadd_ps(load8_fp16(tile + b * T::kBlock + T::kG.m + 16 * h), _mm256_set1_ps(xs[b]), summ);
      res = _mm256_add_ps(res, summ);
    }
    _mm256_storeu_ps(out + 8 * h, res);
  }
}

// Float tiles' activations, 8 at a time (the values of round_f16_row / round_bf16_row).
void round_f16_avx2(const float* x, size_t cols, float* out) {
  for (size_t i = 0; i < cols; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
}
void round_bf16_avx2(const float* x, size_t cols, float* out) {
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  alignas(32) float r[kQK];
  for (size_t i = 0; i < cols; i += kQK) {
    for (size_t j = 0; j < kQK; j += 8) {  // fp32_to_bf16 (round half to even, nan made quiet)
      const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + j));
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), hi);
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
      const __m256i quiet = _mm256_or_si256(_mm256_and_si256(u, hi), _mm256_set1_epi32(0x00400000));
      _mm256_store_ps(r + j, _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, quiet, nan)));
    }
    for (size_t k = 0; k < kQK; ++k) out[i + bf16_act_pos(k)] = r[k];
  }
}

// Float tiles (kernels_impl.h), one output at a time: llama.cpp's 16-lane AVX-512
// accumulators as ymm pairs (lanes 0..7, 8..15), so that the order is the same as there.
// BF16: per 32-block, lane l covers words 2l, 2l+1: the fmas of vdpbf16ps, odd then even;
// x: the block's activations (bf16_act_pos order) for lanes 8h..8h+7.
inline __m256 bf16_dot_step(__m256 acc, __m256i w, const float* xb, int h) {
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w, hi)), _mm256_loadu_ps(xb + 8 * h), acc);
  return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), _mm256_loadu_ps(xb + 16 + 8 * h), acc);
}

// _mm512_reduce_add_ps's tree over the 16 lanes (lo, hi): 8, 4, 2, 1.
inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 u = _mm256_add_ps(lo, hi);
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
  const __m128 t = _mm_add_ps(v, _mm_permute_ps(v, 0x4E));
  return _mm_cvtss_f32(_mm_add_ps(t, _mm_permute_ps(t, 0xB1)));
}

inline __m256 load8_fp16_words(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i load16_words(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// tinyBLAS order, R activation rows x one output (`wrow`: its words of block 0).
template <bool BF16, int R>
void half_gemm_row(const uint8_t* wrow, size_t nb, const ActView& a, size_t r0, float* out) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = wrow + b * kHalfQuadBlock;
    for (int c = 0; c < 2; ++c) {  // F16: 16 k per accumulator; BF16: words 16c.. = lanes 8c..
      if constexpr (!BF16) {
        const __m256 w0 = load8_fp16_words(wb + 32 * c), w1 = load8_fp16_words(wb + 32 * c + 16);
        for (int r = 0; r < R; ++r) {
          const float* x = a.xf(r0 + r) + b * kQK + 16 * c;
          acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), acc[r][1]);
        }
      } else {
        const __m256i w = load16_words(wb + 32 * c);
        for (int r = 0; r < R; ++r) acc[r][c] = bf16_dot_step(acc[r][c], w, a.xf(r0 + r) + b * kQK, c);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = reduce16(acc[r][0], acc[r][1]);
}

// ggml_vec_dot_f16 / _bf16 order, one activation row x one output.
template <bool BF16>
float half_gemv_row(const uint8_t* wrow, size_t nb, const ActView& a, size_t r) {
  constexpr int C = BF16 ? 2 : 4;  // 16-lane accumulators (over each 64 k)
  __m256 acc[C][2];
  for (int c = 0; c < C; ++c) acc[c][0] = acc[c][1] = _mm256_setzero_ps();
  size_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    prefetch_ahead(wrow + b * kHalfQuadBlock, 64);
    prefetch_ahead(wrow + (b + 1) * kHalfQuadBlock, 64);
    if constexpr (!BF16) {
      for (int c = 0; c < 4; ++c) {
        const uint8_t* wb = wrow + (b + c / 2) * kHalfQuadBlock + 32 * (c % 2);
        const float* x = a.xf(r) + b * kQK + 16 * c;
        acc[c][0] = _mm256_fmadd_ps(load8_fp16_words(wb), _mm256_loadu_ps(x), acc[c][0]);
        acc[c][1] = _mm256_fmadd_ps(load8_fp16_words(wb + 16), _mm256_loadu_ps(x + 8), acc[c][1]);
      }
    } else {
      for (int c = 0; c < 2; ++c)
        for (int h = 0; h < 2; ++h)
          acc[c][h] = bf16_dot_step(acc[c][h], load16_words(wrow + (b + c) * kHalfQuadBlock + 32 * h),
                                    a.xf(r) + (b + c) * kQK, h);
    }
  }
  double sum;
  if constexpr (!BF16) {
    __m256 t[2];
    for (int h = 0; h < 2; ++h)
      t[h] = _mm256_add_ps(_mm256_add_ps(acc[0][h], acc[2][h]), _mm256_add_ps(acc[1][h], acc[3][h]));
    sum = reduce16(t[0], t[1]);
  } else {
    sum = static_cast<double>(reduce16(acc[0][0], acc[0][1])) + static_cast<double>(reduce16(acc[1][0], acc[1][1]));
  }
  if (b < nb) {  // an odd last 32-block: llama.cpp's scalar tail, float products summed in double
    for (size_t k = 0; k < kQK; ++k) {
      const uint16_t v = load_u16(wrow + b * kHalfQuadBlock + 2 * k);
      const uint32_t wu = static_cast<uint32_t>(v) << 16;
      float w;
      std::memcpy(&w, &wu, 4);
      if (!BF16) w = _cvtsh_ss(v);
      const float x = a.xf(r)[b * kQK + (BF16 ? bf16_act_pos(k) : k)];
      sum += static_cast<double>(w * x);
    }
  }
  return static_cast<float>(sum);
}

template <bool BF16, bool Gemm>
void half_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
               unsigned o_lo, unsigned o_hi) {
  // Rows outside, outputs inside: a group's activations and the tile stay in L1.
  size_t r = 0;
  if constexpr (Gemm) {
    float out[4];
    for (; r + 4 <= nr; r += 4)
      for (unsigned o = o_lo; o < o_hi; ++o) {
        half_gemm_row<BF16, 4>(tile + half_word_offset(nb, o, 0, 0), nb, a, r0 + r, out);
        for (int i = 0; i < 4; ++i) y[(r + i) * y_stride + o] = out[i];
      }
    for (; r < nr; ++r)
      for (unsigned o = o_lo; o < o_hi; ++o) {
        half_gemm_row<BF16, 1>(tile + half_word_offset(nb, o, 0, 0), nb, a, r0 + r, out);
        y[r * y_stride + o] = out[0];
      }
  } else {
    for (; r < nr; ++r)
      for (unsigned o = o_lo; o < o_hi; ++o)
        y[r * y_stride + o] = half_gemv_row<BF16>(tile + half_word_offset(nb, o, 0, 0), nb, a, r0 + r);
  }
}

// K super-tiles (kernels_impl.h): 8 rows (half h) x R activation rows. Weights are
// unsigned (<= 63), so maddubs needs no sign trick and cannot saturate.
inline __m256i scales8(const uint8_t* p, bool is_signed) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}
// A 32-bit lane's scale in both of its 16-bit halves: vpmaddwd with the vpmaddubsw pairs
// then gives scale * (4-element sum) exactly, without a vpmulld.
inline __m256i scale_pairs8(__m256i s) {
  return _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(s, 16));
}
// Two rows of 8 bytes (lo[k], hi[k]) as 8 int32 lanes of int16 pairs (lo[k] | hi[k] << 16),
// for a vpmaddwd with a broadcast pair: lo[k] x a + hi[k] x b per lane.
inline __m256i byte_pairs8(const uint8_t* lo, const uint8_t* hi, bool is_signed) {
  const __m128i v = _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo)),
                                      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi)));
  return is_signed ? _mm256_cvtepi8_epi16(v) : _mm256_cvtepu8_epi16(v);
}

// The vec-dot order (one row at a time: decode), R activation rows x all
// 16 rows of the tile (out[r][16]). Decode streams the weights from memory once, so both
// halves of a super-tile are done while it is in L1: a pass per half over the whole row
// left the memory idle during the second pass (the prefetches run ahead only in the first).
template <KQuant Q, int R>
void k_vec(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, float* out) {
  constexpr KTileGeom G = ktile_geom(Q);
  __m256 lane[R][2][8], accm[R][2][4], summs[R][2];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 8; ++g) lane[r][h][g] = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) accm[r][h][i] = _mm256_setzero_ps();
      summs[r][h] = _mm256_setzero_ps();
    }
  for (size_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* t = tile + sb * G.bytes;
    for (int h = 0; h < 2; ++h) {
      __m256i S[R][8];
      for (int g = 0; g < 8; ++g) {
        if constexpr (Q == KQuant::Q6) {  // the -32 offset, lane g taking block g's share:
          // -32 x (scale_lo x bsum_lo + scale_hi x bsum_hi), one vpmaddwd on int16 pairs
          const __m256i sc = byte_pairs8(t + G.sc + 16 * g + 8 * h, t + G.sc_hi + 16 * g + 8 * h, true);
          for (int r = 0; r < R; ++r) {
            const __m256i dot = _mm256_madd_epi16(sc, _mm256_set1_epi32(a.kpairs(r0 + r)[12 * sb + 4 + g]));
            S[r][g] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(dot, 5));
          }
        } else {
          for (int r = 0; r < R; ++r) S[r][g] = _mm256_setzero_si256();
        }
      }
      for (size_t c = 0; c < 8; ++c) {
        const size_t b = sb * 8 + c;
        __m256i w[8];
        if (h == 0)  // an eighth of the super-tile ahead per block: scales and d included
          for (size_t off = c * G.bytes / 8 / 64 * 64; off < (c + 1) * G.bytes / 8; off += 64)
            __builtin_prefetch(t + kStreamPrefetchBytes + off, 0, 3);
        nib_block_half<G.high_bits>(t + G.block * c, h, w);
        const __m256i sc_lo = scale_pairs8(scales8(t + G.sc + 16 * c + 8 * h, Q == KQuant::Q6));
        const __m256i sc_hi = Q == KQuant::Q6 ? scale_pairs8(scales8(t + G.sc_hi + 16 * c + 8 * h, true)) : sc_lo;
        for (int r = 0; r < R; ++r) {
          const int8_t* q = a.qs(r0 + r) + b * kQK;
          for (int g = 0; g < 8; ++g)
            S[r][g] = _mm256_add_epi32(S[r][g], _mm256_madd_epi16(_mm256_maddubs_epi16(w[g], bcast32(q + 4 * g)),
                                                                  g < 4 ? sc_lo : sc_hi));
        }
      }
      const __m256 dw = load8_fp16(t + G.d + 16 * h);
      for (int r = 0; r < R; ++r) {
        const float xd = a.kd(r0 + r)[sb];
        const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(xd), dw);
        for (int g = 0; g < 8; ++g) lane[r][h][g] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[r][g]), lane[r][h][g]);
        if constexpr (Q != KQuant::Q6) {
          const __m256 dmin =
              _mm256_mul_ps(_mm256_set1_ps(-xd), load8_fp16(t + G.dmin + 16 * h));
          // Blocks 2i and 2i + 1's min x bsum, summed: one vpmaddwd of the mins' int16 pairs
          // with the record's bsum pairs (kpairs), the same integers as two vpmulld and an add.
          const int32_t* xpairs = a.kpairs(r0 + r) + 12 * sb;
          __m256i mb[4];
          for (int i = 0; i < 4; ++i)
            mb[i] = _mm256_madd_epi16(byte_pairs8(t + G.m + 32 * i + 8 * h, t + G.m + 32 * i + 16 + 8 * h, false),
                                      _mm256_set1_epi32(xpairs[i]));
          if constexpr (Q == KQuant::Q4) {
            for (int i = 0; i < 4; ++i) accm[r][h][i] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(mb[i]), accm[r][h][i]);
          } else {
            const __m256i tot = _mm256_add_epi32(_mm256_add_epi32(mb[0], mb[1]), _mm256_add_epi32(mb[2], mb[3]));
            summs[r][h] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(tot), summs[r][h]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      __m256 res = hsum8_lanes(lane[r][h]);
      const __m256* m = accm[r][h];
      if constexpr (Q == KQuant::Q4) res = _mm256_add_ps(res, _mm256_add_ps(_mm256_add_ps(m[0], m[2]), _mm256_add_ps(m[1], m[3])));
      if constexpr (Q == KQuant::Q5) res = _mm256_add_ps(res, summs[r][h]);
      _mm256_storeu_ps(out + 16 * r + 8 * h, res);
    }
}

template <KQuant Q>
void k_vec_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
                unsigned o_lo, unsigned o_hi) {
  alignas(32) float buf[2 * 16];
  for (size_t r = 0; r < nr;) {
    const size_t g = nr - r >= 2 ? 2 : 1;
    if (g == 2) k_vec<Q, 2>(tile, nb, a, r0 + r, buf);
    else k_vec<Q, 1>(tile, nb, a, r0 + r, buf);
    for (size_t i = 0; i < g; ++i)
      for (unsigned o = o_lo; o < o_hi; ++o) y[(r + i) * y_stride + o] = buf[16 * i + o];
    r += g;
  }
}

// Prefill over a nibble or byte tile: each half tile (8 output rows) is unpacked once per
// call into a buffer that the activation rows then share (the call gets up to 64 rows):
// per block, the 8 groups' weight values (signed kinds: w, then |w|, for |w| x sign(x, w)),
// then the 8 rows' d as floats (and m for Q4_1 / Q5_1). The dot of one row then reads
// the weights as they are, 8 accumulators (one per group), all groups in one pass: per
// group and block a broadcast, maddubs, madd, cvt and fma (+ sign for signed kinds).
template <PairKind P>
struct Unpacked {
  using T = PairTraits<P>;
  static constexpr size_t kGroupBytes = T::kSigned ? 64 : 32;
  static constexpr size_t kD = 8 * kGroupBytes;
  static constexpr size_t kM = kD + 32;
  static constexpr size_t kStride = kM + (T::kMin ? 32 : 0);
};

template <PairKind P>
void unpack_half(const uint8_t* tile, size_t nb, int h, uint8_t* buf) {
  using T = PairTraits<P>;
  using U = Unpacked<P>;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = tile + b * T::kBlock;
    uint8_t* ub = buf + b * U::kStride;
    for (int L = 0; L < 4; ++L) {
      __m256i w[2];
      load_pair<P>(wb, h, L, w[0], w[1]);
      for (int i = 0; i < 2; ++i) {
        uint8_t* gb = ub + (L + 4 * i) * U::kGroupBytes;
        _mm256_store_si256(reinterpret_cast<__m256i*>(gb), w[i]);
        if constexpr (T::kSigned) _mm256_store_si256(reinterpret_cast<__m256i*>(gb + 32), _mm256_abs_epi8(w[i]));
      }
    }
    _mm256_store_ps(reinterpret_cast<float*>(ub + U::kD), load8_fp16(wb + T::kD + 16 * h));
    if constexpr (T::kMin) _mm256_store_ps(reinterpret_cast<float*>(ub + U::kM), load8_fp16(wb + T::kG.m + 16 * h));
  }
}

template <PairKind P>
void unpacked_row(const uint8_t* buf, size_t nb, const ActView& a, size_t r, float* out) {
  using T = PairTraits<P>;
  using U = Unpacked<P>;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[8];
  for (int g = 0; g < 8; ++g) acc[g] = _mm256_setzero_ps();
  const int8_t* xq = a.qs(r);
  const float* xd = a.d(r);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* ub = buf + b * U::kStride;
    const int8_t* q = xq + b * kQK;
    const __m256 dd = _mm256_mul_ps(_mm256_load_ps(reinterpret_cast<const float*>(ub + U::kD)), _mm256_set1_ps(xd[b]));
    for (int g = 0; g < 8; ++g) {
      const uint8_t* gb = ub + g * U::kGroupBytes;
      const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(gb));
      __m256i p;
      if constexpr (T::kSigned)
        p = _mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb + 32)),
                                 _mm256_sign_epi8(bcast32(q + 4 * g), w));
      else
        p = _mm256_maddubs_epi16(w, bcast32(q + 4 * g));
      acc[g] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[g]);
    }
  }
  __m256 res = hsum8_lanes(acc);
  if constexpr (T::kMin) {
    const float* xs = a.s16(r);
    __m256 summ = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b)
      summ = _mm256_fmadd_ps(_mm256_load_ps(reinterpret_cast<const float*>(buf + b * U::kStride + U::kM)),
                             _mm256_set1_ps(xs[b]), summ);
    res = _mm256_add_ps(res, summ);
  }
  _mm256_storeu_ps(out, res);
}

// Fewer than kUnpackRows activation rows read the tile directly (decode); more share an
// unpacked copy of each half tile.
constexpr size_t kUnpackRows = 2;

template <PairKind P>
void pair_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
               unsigned o_lo, unsigned o_hi) {
  if (nr < kUnpackRows) {  // decode: read the tile directly
    alignas(32) float buf[16];
    for (size_t r = 0; r < nr; ++r) {
      pair_vec<P>(tile, nb, a, r0 + r, buf);
      for (unsigned o = o_lo; o < o_hi; ++o) y[r * y_stride + o] = buf[o];
    }
    return;
  }
  alignas(32) float buf[8];
  uint8_t* ub = unpack_scratch(nb * Unpacked<P>::kStride);
  for (int h = 0; h < 2; ++h) {
    const unsigned lo = std::max(o_lo, 8u * h), hi = std::min(o_hi, 8u * h + 8);
    if (lo >= hi) continue;
    unpack_half<P>(tile, nb, h, ub);
    for (size_t r = 0; r < nr; ++r) {
      unpacked_row<P>(ub, nb, a, r0 + r, buf);
      for (unsigned o = lo; o < hi; ++o) y[r * y_stride + o] = buf[o - 8 * h];
    }
  }
}

template <PairKind P>
constexpr TileKernelFn kPairTile = pair_tile<P>;


}  // namespace

template <KQuant Q>
constexpr TileKernelFn kKTile = k_vec_tile<Q>;

TileKernelFn kquant_tile_avx2(KQuant q) {
  switch (q) {
    case KQuant::Q4: return kKTile<KQuant::Q4>;
    case KQuant::Q5: return kKTile<KQuant::Q5>;
    case KQuant::Q6: break;
  }
  return kKTile<KQuant::Q6>;
}

const IsaKernels& isa_kernels_avx2() {
  static const IsaKernels k{quantize_q8_avx2,  quantize_q8_k_avx2, kPairTile<PairKind::Q4_1>, kPairTile<PairKind::Q4_0>,
                            kPairTile<PairKind::Q5_1>, kPairTile<PairKind::Q5_0>, kPairTile<PairKind::Q8_0>,
                            half_tile<false, false>,
                            half_tile<true, false>,
                            half_tile<false, true>,
                            half_tile<true, true>,
                            kquant_tile_avx2(KQuant::Q4), kquant_tile_avx2(KQuant::Q5), kquant_tile_avx2(KQuant::Q6),
                            round_f16_avx2,
                            round_bf16_avx2};
  return k;
}

}  // namespace cf::kern

// AVX-512 VNNI kernels. One zmm holds 16 output rows x 4 k-bytes; vpdpbusd multiplies the
// unsigned weight bytes (Q4_1 nibbles, Q8_0 stored as w+128) by the broadcast signed
// activation bytes, giving one 4-element group's exact sum per output row. Each group has
// its own float accumulator (llama.cpp's order, kernels_impl.h), so two activation rows
// share each unpacked weight block. Per-lane float arithmetic is the same sequence as the
// portable kernel (bit-identical).
// GCC 12 reports its own _mm512_undefined_* helpers as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "model/kernels_impl.h"


namespace cf::kern {
namespace {

inline float fp16_round_f16c(float f) {
  return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

void quantize_q8_avx512(const float* x, size_t cols, uint8_t* out) {
  const size_t nb = cols / kQK;
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* dv = reinterpret_cast<float*>(out + nb * kQK);
  float* s16 = dv + nb;
  int32_t* cv = reinterpret_cast<int32_t*>(dv + 2 * nb);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (size_t b = 0; b < nb; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + b * kQK), v1 = _mm512_loadu_ps(x + b * kQK + 16);
    const __m512 mx = _mm512_max_ps(_mm512_and_ps(v0, abs_mask), _mm512_and_ps(v1, abs_mask));
    const float amax = _mm512_reduce_max_ps(mx);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 mul = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * kQK), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * kQK + 16), _mm512_cvtsepi32_epi8(q1));
    // Sum of the saturated bytes (saturation never triggers: |x*id| <= 127).
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    dv[b] = fp16_round_f16c(d);
    s16[b] = fp16_round_f16c(d * static_cast<float>(sum));
    // Per 4-element group: vpdpbusd of the bytes with 0x80 gives 128 * their sum.
    const __m256i groups = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)),
                                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * kQK)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cv + 8 * b), _mm256_sub_epi32(_mm256_setzero_si256(), groups));
  }
}

// quantize_q8_k_record (kernels_kquant.cpp) 16 lanes at a time, the same values: the
// value of largest magnitude is the first one in order (its sign sets the scale's), and
// q = round-half-even(iscale * x), capped at 127.
void quantize_q8_k_avx512(const float* x, size_t cols, uint8_t* out) {
  const size_t nb = cols / kQK;
  const auto [qs, dv, bs16] = q8k_record(out, nb);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (size_t sb = 0; sb < nb / 8; ++sb) {
    const float* xs = x + sb * kQK_K;
    int8_t* q = qs + sb * kQK_K;
    __m512 mx = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) mx = _mm512_max_ps(mx, _mm512_and_ps(_mm512_loadu_ps(xs + 16 * i), abs_mask));
    const float amax = _mm512_reduce_max_ps(mx);
    if (amax == 0.0f) {
      std::memset(q, 0, kQK_K);
      std::memset(bs16 + 16 * sb, 0, 16 * sizeof(int32_t));
      dv[sb] = 0.0f;
      continue;
    }
    float max = amax;
    for (int i = 0; i < 16; ++i) {
      const __mmask16 hit =
          _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_loadu_ps(xs + 16 * i), abs_mask), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit) {
        max = xs[16 * i + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 mul = _mm512_set1_ps(iscale);
    for (int i = 0; i < 16; ++i) {
      __m512i v = _mm512_cvt_roundps_epi32(_mm512_mul_ps(mul, _mm512_loadu_ps(xs + 16 * i)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm512_min_epi32(v, _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * i), _mm512_cvtepi32_epi8(v));
      bs16[16 * sb + i] = _mm512_reduce_add_epi32(v);
    }
    dv[sb] = 1.0f / iscale;
  }
  fill_q8k_pairs(out, nb);
}

inline __m512i bcast32(const int8_t* p) { return _mm512_set1_epi32(load_i32(p)); }
// acc + vpdpbusd(w, the 4 activation bytes at p in every lane), the bytes read by the
// instruction's own broadcast operand (GCC emits a vpbroadcastd per _mm512_set1_epi32).
// Faster in the K-quant GEMM (bench_gemm q4_k/896/4864/512: 127 -> 142 GMAC/s, 5
// alternated rounds), slower in the nibble and byte tiles (q8_0/4864/896/512: 73 -> 60),
// where GCC's own schedule of the broadcasts wins; used in the first only.
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// llama.cpp's hsum_float_8 over 8 per-group accumulators, lane by lane.
inline __m512 hsum8_lanes(const __m512 l[8]) {
  return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6])),
                       _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7])));
}

inline __m512 load16_fp16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The 8 groups of weight values (16 rows x 4 elements each, one per byte) of a nibble block
// with HB high-bit lines (kernels_impl.h): the nibbles, with the high-bit fields moved to
// bits 4.. (a 16-bit shift, then a mask that drops what crossed from the neighbouring byte).
template <int HB>
inline __m512i high_field(const __m512i* qh, int g) {
  const int bit = g * HB % 8;
  const __m512i x = qh[g * HB / 8];
  const __m512i placed = bit < 4 ? _mm512_slli_epi16(x, 4 - bit) : bit > 4 ? _mm512_srli_epi16(x, bit - 4) : x;
  return _mm512_and_si512(placed, _mm512_set1_epi8(static_cast<char>(((1 << HB) - 1) << 4)));
}
template <int HB>
inline void load_nib_block(const uint8_t* blk, __m512i w[8]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i qh[2];
  for (int h = 0; h < HB; ++h) qh[h] = _mm512_loadu_si512(blk + 256 + 64 * h);
  for (int line = 0; line < 4; ++line) {
    const __m512i v = _mm512_loadu_si512(blk + 64 * line), v_hi = _mm512_srli_epi16(v, 4);
    if constexpr (HB == 0) {
      w[line] = _mm512_and_si512(v, low4);
      w[line + 4] = _mm512_and_si512(v_hi, low4);
    } else {  // (nibble & 0x0F) | field: vpternlogd 0xEC = (a & c) | b
      w[line] = _mm512_ternarylogic_epi32(v, high_field<HB>(qh, line), low4, 0xEC);
      w[line + 4] = _mm512_ternarylogic_epi32(v_hi, high_field<HB>(qh, line + 4), low4, 0xEC);
    }
  }
}

// Nibble tiles (nib_geom), R activation rows (R <= 2: 8 accumulators per row must stay in
// registers).
// unpacked: the tile's blocks already unpacked (8 groups each, nib_tile), or null.
template <NibKind K, int R>
inline void nib_rows(const uint8_t* tile, const __m512i* unpacked, size_t nb, const ActView& a, size_t r0, float* y,
                     size_t y_stride, __mmask16 store_mask) {
  constexpr NibGeom G = nib_geom(K);
  __m512 acc[R][8];
  const int8_t* xq[R];
  const float* xd[R];
  const int32_t* xc[R];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < 8; ++g) acc[r][g] = _mm512_setzero_ps();
    xq[r] = a.qs(r0 + r);
    xd[r] = a.d(r0 + r);
    xc[r] = a.corr(r0 + r);
  }
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = tile + b * G.block;
    __m512i w[8];
    if (unpacked) {
      for (int g = 0; g < 8; ++g) w[g] = _mm512_load_si512(unpacked + 8 * b + g);
    } else {
      prefetch_ahead(wb, G.block);
      load_nib_block<G.high_bits>(wb, w);
    }
    const __m512 dw = load16_fp16(wb + G.d);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = xq[r] + b * kQK;
      const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xd[r][b]));
      // w[g] holds elements 4g..4g+3 of each row: one lane of llama.cpp's accumulator.
      // Q4_0 / Q5_0 start each group at -8 / -16 sum(q) (= corr >> 4 / >> 3).
      for (int g = 0; g < 8; ++g) {
        const __m512i start =
            G.start_shift ? _mm512_set1_epi32(xc[r][8 * b + g] >> G.start_shift) : _mm512_setzero_si512();
        const __m512i s = _mm512_dpbusd_epi32(start, w[g], bcast32(q + 4 * g));
        acc[r][g] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), acc[r][g]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    __m512 out = hsum8_lanes(acc[r]);
    if constexpr (G.has_min) {
      const float* xs = a.s16(r0 + r);
      __m512 summ = _mm512_setzero_ps();
      for (size_t b = 0; b < nb; ++b)
        summ = _mm512_fmadd_ps(load16_fp16(tile + b * G.block + G.m), _mm512_set1_ps(xs[b]), summ);
      out = _mm512_add_ps(out, summ);
    }
    _mm512_mask_storeu_ps(y + r * y_stride, store_mask, out);
  }
}

// Byte tiles: kByte16 (fp16 d; Q8_0).
template <int R>
inline void byte_rows(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, float* y, size_t y_stride,
                      __mmask16 store_mask) {
  __m512 acc[R][8];
  const int8_t* xq[R];
  const float* xd[R];
  const int32_t* xc[R];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < 8; ++g) acc[r][g] = _mm512_setzero_ps();
    xq[r] = a.qs(r0 + r);
    xd[r] = a.d(r0 + r);
    xc[r] = a.corr(r0 + r);
  }
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = tile + b * kByte16TileBlock;
    prefetch_ahead(wb, kByte16TileBlock);
    __m512i w[8];
    for (int g = 0; g < 8; ++g) w[g] = _mm512_loadu_si512(wb + 64 * g);
    const __m512 dw = load16_fp16(wb + 512);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = xq[r] + b * kQK;
      const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xd[r][b]));
      for (int g = 0; g < 8; ++g) {
        // Start from -128 * sum(q of the group): sum (w+128) q - 128 sum q = sum w q exactly.
        const __m512i s = _mm512_dpbusd_epi32(_mm512_set1_epi32(xc[r][8 * b + g]), w[g], bcast32(q + 4 * g));
        acc[r][g] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), acc[r][g]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * y_stride, store_mask, hsum8_lanes(acc[r]));
}

// Float tiles' activations, 16 at a time (the values of round_f16_row / round_bf16_row).
void round_f16_avx512(const float* x, size_t cols, float* out) {
  for (size_t i = 0; i < cols; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
}
// fp32_to_bf16 (round half to even, nan made quiet) and back.
inline __m512 bf16_round16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v), hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), hi);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_castsi512_ps(_mm512_mask_or_epi32(r, nan, _mm512_and_si512(u, hi), _mm512_set1_epi32(0x00400000)));
}
void round_bf16_avx512(const float* x, size_t cols, float* out) {
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i even = _mm512_sub_epi32(odd, _mm512_set1_epi32(1));
  for (size_t i = 0; i < cols; i += kQK) {  // each 32-block: odd k, then even k (bf16_act_pos)
    const __m512 lo = bf16_round16(_mm512_loadu_ps(x + i)), hi = bf16_round16(_mm512_loadu_ps(x + i + 16));
    _mm512_storeu_ps(out + i, _mm512_permutex2var_ps(lo, odd, hi));
    _mm512_storeu_ps(out + i + 16, _mm512_permutex2var_ps(lo, even, hi));
  }
}

// Float tiles (kernels_impl.h), one quad of 4 outputs at a time: each output's
// accumulators are zmm over k, as llama.cpp's tinyBLAS and ggml_vec_dot_f16/_bf16 hold them.
// F16 converts 16 weights per vcvtph2ps. BF16's step is vdpbf16ps's: the vec-dot (decode)
// runs the instruction where the CPU has it; the GEMM runs its two-fma form where that
// gives the same bits (checked at start-up), as it is faster there (on this Xeon one
// vdpbf16ps takes 2 cycles for what 2 fmas on 2 ports do in 1).
enum class HalfOp { F16, Bf16Fma, Bf16Dp };

inline __m512 bf16_odd(__m512i w) {
  return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline __m512 bf16_even(__m512i w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
// A BF16 activation block (odd k, then even k) as the word pairs vdpbf16ps reads.
inline __m512i bf16_pairs(const float* xb) {
  const __m512i odd = _mm512_castps_si512(_mm512_loadu_ps(xb)), even = _mm512_castps_si512(_mm512_loadu_ps(xb + 16));
  return _mm512_or_si512(_mm512_and_si512(odd, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))), _mm512_srli_epi32(even, 16));
}
inline __m512 vdpbf16ps(__m512 acc, __m512i w, __m512i x) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));  // the file is not built for AVX512-BF16
  return acc;
}
inline __m512 bf16_fma2(__m512 acc, __m512 w_odd, __m512 w_even, const float* xb) {
  acc = _mm512_fmadd_ps(w_odd, _mm512_loadu_ps(xb), acc);
  return _mm512_fmadd_ps(w_even, _mm512_loadu_ps(xb + 16), acc);
}

// Whether vdpbf16ps gives its two-fma form's bits on this CPU (the caller checks that it
// has the instruction): random normal operands with cancellations, 4096 lanes.
bool bf16_fma_form_exact() {
  uint32_t seed = 0x9E3779B9u;
  auto next = [&] { return seed = seed * 1664525u + 1013904223u; };
  auto value = [&](int spread) {  // sign, exponent 127 +- spread, 7 mantissa bits
    const uint32_t r = next();
    return ((r & 0x8000u) << 16) | ((127u - spread + (r >> 16) % (2 * spread + 1)) << 23) | ((r >> 8 & 0x7Fu) << 16);
  };
  for (int it = 0; it < 256; ++it) {
    alignas(64) uint16_t w[32];
    alignas(64) float xb[32], acc[16];
    for (int k = 0; k < 32; ++k) {
      w[k] = static_cast<uint16_t>(value(12) >> 16);
      const uint32_t xu = value(12);
      std::memcpy(&xb[bf16_act_pos(k)], &xu, 4);
    }
    for (int l = 0; l < 16; ++l) {
      const uint32_t au = value(20) | (next() & 0xFFFFu);
      std::memcpy(&acc[l], &au, 4);
    }
    const __m512i wv = _mm512_load_si512(w);
    const __m512 a0 = _mm512_load_ps(acc);
    if (_mm512_cmpneq_epi32_mask(_mm512_castps_si512(vdpbf16ps(a0, wv, bf16_pairs(xb))),
                                 _mm512_castps_si512(bf16_fma2(a0, bf16_odd(wv), bf16_even(wv), xb))))
      return false;
  }
  return true;
}

// _mm512_reduce_add_ps's tree (upper half onto lower: 8, 4, 2, 1 lanes) of 4 vectors at
// once, the same pairs added; the 4 sums in lanes 0..3.
inline __m128 reduce16_x4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
  const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
  const __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xDD));
  const __m512 t = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
  const __m512 s = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
  return _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, s));
}

inline float f32_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline __m512 load16_fp16_words(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// tinyBLAS order, R activation rows x the 4 outputs of quad `qb`: out[4 r + i].
template <HalfOp Op, int R>
inline void half_gemm_quad(const uint8_t* qb, size_t nb, const ActView& a, size_t r0, float* out) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = qb + b * kHalfQuadBlock;
    prefetch_ahead(wb, kHalfQuadBlock);
    if constexpr (Op == HalfOp::F16) {
      for (int c = 0; c < 2; ++c) {  // 4 weight vectors, then one activation vector at a time
        __m512 w[4];
        for (int i = 0; i < 4; ++i) w[i] = load16_fp16_words(wb + 64 * i + 32 * c);
        for (int r = 0; r < R; ++r) {
          const __m512 x = _mm512_loadu_ps(a.xf(r0 + r) + b * kQK + 16 * c);
          for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_fmadd_ps(w[i], x, acc[r][i]);
        }
      }
    } else if constexpr (Op == HalfOp::Bf16Dp) {
      __m512i xw[R];
      for (int r = 0; r < R; ++r) xw[r] = bf16_pairs(a.xf(r0 + r) + b * kQK);
      for (int i = 0; i < 4; ++i) {
        const __m512i w = _mm512_loadu_si512(wb + 64 * i);
        for (int r = 0; r < R; ++r) acc[r][i] = vdpbf16ps(acc[r][i], w, xw[r]);
      }
    } else {
      // The odd words' fmas of all 4 x R, then the even ones': R activation vectors live at
      // a time, next to the 4 R accumulators.
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 4; ++i) {
          const __m512i w = _mm512_loadu_si512(wb + 64 * i);
          const __m512 wf = h == 0 ? bf16_odd(w) : bf16_even(w);
          for (int r = 0; r < R; ++r)
            acc[r][i] = _mm512_fmadd_ps(wf, _mm512_loadu_ps(a.xf(r0 + r) + b * kQK + 16 * h), acc[r][i]);
        }
    }
  }
  for (int r = 0; r < R; ++r) _mm_storeu_ps(out + 4 * r, reduce16_x4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
}

// ggml_vec_dot_f16 / _bf16 order, one activation row x the 4 outputs of quad `qb`.
template <HalfOp Op>
inline void half_gemv_quad(const uint8_t* qb, size_t nb, const ActView& a, size_t r, float* out) {
  constexpr bool kF16 = Op == HalfOp::F16;
  constexpr int C = kF16 ? 4 : 2;  // accumulators per output (over each 64 k)
  __m512 acc[4][C];
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = _mm512_setzero_ps();
  size_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    prefetch_ahead(qb + b * kHalfQuadBlock, 2 * kHalfQuadBlock);
    if constexpr (kF16) {
      for (int c = 0; c < 4; ++c) {
        const uint8_t* wb = qb + (b + c / 2) * kHalfQuadBlock + 32 * (c % 2);
        const __m512 x = _mm512_loadu_ps(a.xf(r) + b * kQK + 16 * c);
        for (int i = 0; i < 4; ++i) acc[i][c] = _mm512_fmadd_ps(load16_fp16_words(wb + 64 * i), x, acc[i][c]);
      }
    } else {
      for (int c = 0; c < 2; ++c) {
        const uint8_t* wb = qb + (b + c) * kHalfQuadBlock;
        const float* xb = a.xf(r) + (b + c) * kQK;
        if constexpr (Op == HalfOp::Bf16Dp) {
          const __m512i xw = bf16_pairs(xb);
          for (int i = 0; i < 4; ++i) acc[i][c] = vdpbf16ps(acc[i][c], _mm512_loadu_si512(wb + 64 * i), xw);
        } else {
          for (int i = 0; i < 4; ++i) {
            const __m512i w = _mm512_loadu_si512(wb + 64 * i);
            acc[i][c] = bf16_fma2(acc[i][c], bf16_odd(w), bf16_even(w), xb);
          }
        }
      }
    }
  }
  double sum[4];
  alignas(16) float s0[4], s1[4];
  if constexpr (kF16) {
    __m512 t[4];
    for (int i = 0; i < 4; ++i)
      t[i] = _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][2]), _mm512_add_ps(acc[i][1], acc[i][3]));
    _mm_store_ps(s0, reduce16_x4(t[0], t[1], t[2], t[3]));
    for (int i = 0; i < 4; ++i) sum[i] = s0[i];
  } else {
    _mm_store_ps(s0, reduce16_x4(acc[0][0], acc[1][0], acc[2][0], acc[3][0]));
    _mm_store_ps(s1, reduce16_x4(acc[0][1], acc[1][1], acc[2][1], acc[3][1]));
    for (int i = 0; i < 4; ++i) sum[i] = static_cast<double>(s0[i]) + static_cast<double>(s1[i]);
  }
  if (b < nb) {  // an odd last 32-block: llama.cpp's scalar tail, float products summed in double
    const uint8_t* wb = qb + b * kHalfQuadBlock;
    for (int i = 0; i < 4; ++i)
      for (size_t k = 0; k < kQK; ++k) {
        const uint16_t v = load_u16(wb + 64 * i + 2 * k);
        const float w = kF16 ? _cvtsh_ss(v) : f32_bits(static_cast<uint32_t>(v) << 16);
        const float x = a.xf(r)[b * kQK + (kF16 ? k : bf16_act_pos(k))];
        sum[i] += static_cast<double>(w * x);
      }
  }
  for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(sum[i]);
}

using RowsFn = void (*)(const uint8_t*, size_t, const ActView&, size_t, float*, size_t, __mmask16);

inline __mmask16 lane_mask(unsigned o_lo, unsigned o_hi) {
  return static_cast<__mmask16>(((1u << o_hi) - 1) & ~((1u << o_lo) - 1));
}

template <RowsFn F1, RowsFn F2>
void run_rows(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
              unsigned o_lo, unsigned o_hi) {
  const __mmask16 mask = lane_mask(o_lo, o_hi);
  size_t r = 0;
  // Each lane's arithmetic is the same whatever the group size.
  for (; r + 2 <= nr; r += 2) F2(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  if (r < nr) F1(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
}

template <RowsFn F1, RowsFn F2, RowsFn F4, RowsFn F8 = nullptr>
void run_rows4(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
               unsigned o_lo, unsigned o_hi) {
  const __mmask16 mask = lane_mask(o_lo, o_hi);
  size_t r = 0;
  if constexpr (F8 != nullptr)
    for (; r + 8 <= nr; r += 8) F8(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  for (; r + 4 <= nr; r += 4) F4(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  for (; r + 2 <= nr; r += 2) F2(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  if (r < nr) F1(tile, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
}

// K super-tiles (kernels_impl.h), R activation rows. Integer sums are exact, so each order
// may group them as is cheapest; only the float steps follow llama.cpp's:
// - vec-dot order keeps one integer sum per lane group g (its float accumulator): vpmaddubsw
//   pairs the unsigned weights with the activation bytes (|pair| <= 2 * 63 * 128, no
//   saturation), vpdpwssd multiplies by the sub-block scale held in both 16-bit halves and
//   accumulates, 2 instructions per group;
// - the tiled-GEMM order needs only a lane's super-block total: vpdpbusd chains the groups
//   of a 32-block and one vpmulld scales them (two for Q6_K's 16-element scales).
// The min (Q4_K, Q5_K) and -32 offset (Q6_K) terms multiply a tile's 6-bit factors by the
// row's bsums: as int16 pairs (the weights' pair per super-block, shared by the rows; the
// record's kpairs) one vpdpwssd makes two products and their sum, where vpmulld made one.
inline __m512i scales16(const uint8_t* p, bool is_signed) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return is_signed ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
}
// A 32-bit lane's scale in both of its 16-bit halves (the vpdpwssd operand).
inline __m512i scale_pairs(__m512i s) {
  return _mm512_or_si512(_mm512_and_si512(s, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(s, 16));
}
// Two 16-byte rows of factors (lo[k], hi[k]) as 16 int32 lanes of int16 pairs lo[k] | hi[k] << 16.
inline __m512i byte_pairs16(const uint8_t* lo, const uint8_t* hi, bool is_signed) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi));
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(a, b)), _mm_unpackhi_epi8(a, b), 1);
  return is_signed ? _mm512_cvtepi8_epi16(v) : _mm512_cvtepu8_epi16(v);
}
// A super-tile's min / offset factor pairs against the record's kpairs (kernels_impl.h):
// Q4_K / Q5_K (m_2i, m_2i+1) for i < 4, Q6_K (sc_lo g, sc_hi g) for g < 8.
template <KQuant Q>
struct KFactorPairs {
  static constexpr int kN = Q == KQuant::Q6 ? 8 : 4;
  __m512i p[kN];
  explicit KFactorPairs(const uint8_t* t) {
    constexpr KTileGeom G = ktile_geom(Q);
    for (int i = 0; i < kN; ++i)
      p[i] = Q == KQuant::Q6 ? byte_pairs16(t + G.sc + 16 * i, t + G.sc_hi + 16 * i, true)
                             : byte_pairs16(t + G.m + 32 * i, t + G.m + 32 * i + 16, false);
  }
  // Pair i times the row's pair i (two products summed), added to acc.
  __m512i dot(__m512i acc, int i, const int32_t* xpairs) const {
    return _mm512_dpwssd_epi32(acc, p[i], _mm512_set1_epi32(xpairs[(Q == KQuant::Q6 ? 4 : 0) + i]));
  }
};
// x * -32 (Q6_K's offset), as the subtraction of a shift.
inline __m512i times_minus32(__m512i x) { return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(x, 5)); }

template <KQuant Q, int R>
inline void k_rows_vecdot(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, float* y, size_t y_stride,
                          __mmask16 store_mask) {
  constexpr KTileGeom G = ktile_geom(Q);
  __m512 lane[R][8], accm[R][4], summs[R];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < 8; ++g) lane[r][g] = _mm512_setzero_ps();
    for (int i = 0; i < 4; ++i) accm[r][i] = _mm512_setzero_ps();
    summs[r] = _mm512_setzero_ps();
  }
  for (size_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* t = tile + sb * G.bytes;
    __m512i S[R][8];
    if constexpr (Q == KQuant::Q6) {
      const KFactorPairs<Q> fp(t);
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < 8; ++g) S[r][g] = times_minus32(fp.dot(_mm512_setzero_si512(), g, a.kpairs(r0 + r) + 12 * sb));
    } else {
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < 8; ++g) S[r][g] = _mm512_setzero_si512();
    }
    for (size_t c = 0; c < 8; ++c) {
      prefetch_ahead(t + G.block * c, G.block);
      __m512i w[8];
      load_nib_block<G.high_bits>(t + G.block * c, w);
      const __m512i sc_lo = scale_pairs(scales16(t + G.sc + 16 * c, Q == KQuant::Q6));
      const __m512i sc_hi = Q == KQuant::Q6 ? scale_pairs(scales16(t + G.sc_hi + 16 * c, true)) : sc_lo;
      for (int r = 0; r < R; ++r) {
        const int8_t* q = a.qs(r0 + r) + (sb * 8 + c) * kQK;
        for (int g = 0; g < 8; ++g)
          S[r][g] = _mm512_dpwssd_epi32(S[r][g], _mm512_maddubs_epi16(w[g], bcast32(q + 4 * g)), g < 4 ? sc_lo : sc_hi);
      }
    }
    const __m512 dw = load16_fp16(t + G.d);
    // Built here, not with the super-block's start: live across the block loop, the pairs
    // pushed the accumulators out of registers (bench_gemm q4_k/2048/2048/1: 64 GMAC/s
    // there, 77 here).
    const KFactorPairs<Q> fp(t);
    for (int r = 0; r < R; ++r) {
      const float xd = a.kd(r0 + r)[sb];
      const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(xd), dw);
      for (int g = 0; g < 8; ++g) lane[r][g] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(S[r][g]), lane[r][g]);
      if constexpr (Q != KQuant::Q6) {
        const __m512 dmin = _mm512_mul_ps(_mm512_set1_ps(-xd), load16_fp16(t + G.dmin));
        const int32_t* xpairs = a.kpairs(r0 + r) + 12 * sb;
        if constexpr (Q == KQuant::Q4) {  // m_2i * bs_2i + m_2i+1 * bs_2i+1, one float accumulator per i
          for (int i = 0; i < 4; ++i)
            accm[r][i] = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(fp.dot(_mm512_setzero_si512(), i, xpairs)), accm[r][i]);
        } else {
          __m512i tot = _mm512_setzero_si512();
          for (int i = 0; i < 4; ++i) tot = fp.dot(tot, i, xpairs);
          summs[r] = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(tot), summs[r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    __m512 out = hsum8_lanes(lane[r]);
    if constexpr (Q == KQuant::Q4)
      out = _mm512_add_ps(out, _mm512_add_ps(_mm512_add_ps(accm[r][0], accm[r][2]), _mm512_add_ps(accm[r][1], accm[r][3])));
    if constexpr (Q == KQuant::Q5) out = _mm512_add_ps(out, summs[r]);
    _mm512_mask_storeu_ps(y + r * y_stride, store_mask, out);
  }
}

template <HalfOp Op, bool Gemm>
void half_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
               unsigned o_lo, unsigned o_hi) {
  const __mmask16 mask = lane_mask(o_lo, o_hi);
  const unsigned q_lo = o_lo / 4, q_hi = (o_hi + 3) / 4;
  alignas(64) float res[6][16];
  auto rows = [&](size_t r, auto n_rows) {
    constexpr int R = decltype(n_rows)::value;
    for (unsigned q = q_lo; q < q_hi; ++q) {
      const uint8_t* qb = tile + half_word_offset(nb, 4 * q, 0, 0);
      float out[4 * R];
      if constexpr (Gemm)
        half_gemm_quad<Op, R>(qb, nb, a, r0 + r, out);
      else
        half_gemv_quad<Op>(qb, nb, a, r0 + r, out);
      for (int i = 0; i < R; ++i) std::memcpy(&res[i][4 * q], out + 4 * i, 16);
    }
    for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(y + (r + i) * y_stride, mask, _mm512_maskz_load_ps(mask, res[i]));
  };
  size_t r = 0;
  if constexpr (Gemm) {  // 6 rows: 24 accumulators, each weight vector converted once for 6
    for (; r + 6 <= nr; r += 6) rows(r, std::integral_constant<int, 6>{});
    for (; r + 4 <= nr; r += 4) rows(r, std::integral_constant<int, 4>{});
    for (; r + 2 <= nr; r += 2) rows(r, std::integral_constant<int, 2>{});
  }
  for (; r < nr; ++r) rows(r, std::integral_constant<int, 1>{});
}

// Nibble tiles: with more than one pair of activation rows (prefill), the tile's blocks are
// unpacked once into a per-thread buffer that every pair then reads, instead of once per
// pair (the 5-bit types' high bits cost a shift and a mask per group).
template <NibKind K>
void nib_tile(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y, size_t y_stride,
              unsigned o_lo, unsigned o_hi) {
  constexpr NibGeom G = nib_geom(K);
  const __mmask16 mask = lane_mask(o_lo, o_hi);
  const __m512i* unpacked = nullptr;
  if (nr > 2) {
    struct alignas(64) Line {
      uint8_t bytes[64];
    };
    thread_local std::vector<Line> buffer;
    buffer.resize(8 * nb);
    auto* lines = reinterpret_cast<__m512i*>(buffer.data());
    for (size_t b = 0; b < nb; ++b) {
      prefetch_ahead(tile + b * G.block, G.block);
      load_nib_block<G.high_bits>(tile + b * G.block, lines + 8 * b);
    }
    unpacked = lines;
  }
  size_t r = 0;
  for (; r + 2 <= nr; r += 2) nib_rows<K, 2>(tile, unpacked, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
  if (r < nr) nib_rows<K, 1>(tile, unpacked, nb, a, r0 + r, y + r * y_stride, y_stride, mask);
}
template <NibKind K>
constexpr TileKernelFn kNibTile = nib_tile<K>;
constexpr TileKernelFn kByteTile = run_rows<byte_rows<1>, byte_rows<2>>;

}  // namespace

// Two rows share each unpacked block (16 integer accumulators per row).
template <KQuant Q>
constexpr TileKernelFn kKTile = run_rows<k_rows_vecdot<Q, 1>, k_rows_vecdot<Q, 2>>;

TileKernelFn kquant_tile_avx512(KQuant q) {
  switch (q) {
    case KQuant::Q4: return kKTile<KQuant::Q4>;
    case KQuant::Q5: return kKTile<KQuant::Q5>;
    case KQuant::Q6: break;
  }
  return kKTile<KQuant::Q6>;
}

const IsaKernels& isa_kernels_avx512() {
  // llama.cpp's BF16 order is vdpbf16ps's; its two-fma form stands in for it only where it
  // gives the same bits (else llama.cpp's build for this CPU computes something else).
  static const bool bf16_hw = (__builtin_cpu_init(), __builtin_cpu_supports("avx512bf16"));
  static const bool bf16_dp = bf16_hw && !bf16_fma_form_exact();
  static const IsaKernels k{quantize_q8_avx512,         quantize_q8_k_avx512, kNibTile<NibKind::Q4_1>, kNibTile<NibKind::Q4_0>,
                            kNibTile<NibKind::Q5_1>,    kNibTile<NibKind::Q5_0>, kByteTile,
                            half_tile<HalfOp::F16, false>,
                            bf16_hw ? half_tile<HalfOp::Bf16Dp, false> : half_tile<HalfOp::Bf16Fma, false>,
                            half_tile<HalfOp::F16, true>,
                            bf16_dp ? half_tile<HalfOp::Bf16Dp, true> : half_tile<HalfOp::Bf16Fma, true>,
                            kquant_tile_avx512(KQuant::Q4), kquant_tile_avx512(KQuant::Q5),
                            kquant_tile_avx512(KQuant::Q6),
                            round_f16_avx512,
                            round_bf16_avx512};
  return k;
}

}  // namespace cf::kern

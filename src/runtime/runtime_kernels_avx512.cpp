// The runtime kernels on AVX-512 (CMake adds the AVX-512 flags by file name): ScalarOps'
// hooks with AVX-512 intrinsics where GCC's code for the scalar form was slow, each the
// same float operations in the same order as the scalar form it replaces (a zmm register
// holding the 16 lanes of llama.cpp's tinyBLAS<16, __m512>), so the bits are the portable
// kernels'. Batched attention takes attention_flash_avx512.cpp first.
// GCC 12 reports its own _mm512_undefined_* helpers (in _mm512_reduce_add_ps) as
// maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "runtime/exp_simd.h"
#include "runtime/f16c_rows.h"
#include "runtime/runtime_kernels_table.h"

namespace cf::rk {
namespace {

inline __m512 load16_f16(const uint16_t* x) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
// reduce16 of 8 vectors at once as a transposed tree: value for value the additions of
// _mm512_reduce_add_ps on each (lane i + i+8, then + i+4, + i+2, + i+1), in about 3
// instructions a vector instead of 8. The 8 sums, in order.
inline __m256 reduce16_x8(const __m512 a[8]) {
  __m512 x[4], y[2];
  for (int m = 0; m < 4; ++m)  // quarters: [a q0+q2, a q1+q3, b q0+q2, b q1+q3]
    x[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0xEE));
  for (int m = 0; m < 2; ++m)  // quarter e: vector 4m + e's 4 partial sums
    y[m] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], 0xDD));
  // quarter e: [z0(e), z1(e), z0(e+4), z1(e+4)], z_i = y_i + y_i+2
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x44), _mm512_shuffle_ps(y[0], y[1], 0xEE));
  // quarter e: [r(e), r(e+4), r(e), r(e+4)], r = z0 + z1
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(z, z, 0x88), _mm512_shuffle_ps(z, z, 0xDD));
  return _mm512_castps512_ps256(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), r));
}

struct Avx512Ops : ScalarOps<Avx512Ops> {
  static size_t f16_to_f32_prefix(const uint16_t* x, float* y, size_t n) { return f16c_to_f32_prefix(x, y, n); }
  static size_t f32_to_f16_prefix(const float* x, uint16_t* y, size_t n) { return f32_to_f16c_prefix(x, y, n); }

  // SwiGLU 16 lanes at a time (GCC ran the scalar form one value at a time: 6% of a 2048-token
  // prefill of Qwen 0.5B under AMX, by perf). exp16 gives exp_inline's bits (one rounding of
  // j 2^n either way), so the result is the scalar form's (AttentionOrder.SiluIsGgmlSwiglu).
  static size_t silu_mul_prefix(float* gate, const float* up, size_t n) {
    size_t i0 = 0;
    for (; i0 + 16 <= n; i0 += 16) {
      const __m512 g = _mm512_loadu_ps(gate + i0);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
      _mm512_storeu_ps(gate + i0, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), _mm512_loadu_ps(up + i0)));
    }
    return i0;
  }

  static bool batched_tile(const TileArgs& a, std::vector<float>& scratch) { return attend_tile_flash_avx512(a, scratch); }

  // ScalarOps' dot products, the 16 (batched) or 64 (single row) lanes in zmm registers.
  static float dot_batched(const float* __restrict x, const uint16_t* __restrict y, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), load16_f16(y + i), acc);
    return _mm512_reduce_add_ps(acc);  // GCC's and clang's tree is reduce16's
  }
  static float dot_single(const float* __restrict x, const uint16_t* __restrict y, int n) {
    const int main = n & ~63;
    __m512 l[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0; i < main; i += 64)
      for (int j = 0; j < 4; ++j)
        l[j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * j), load16_f16(y + i + 16 * j), l[j]);
    // GCC's and clang's _mm512_reduce_add_ps are reduce16's tree.
    double sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(l[0], l[2]), _mm512_add_ps(l[1], l[3])));
    for (int i = main; i < n; ++i) sum += static_cast<double>(x[i] * f16_to_f32_scalar(y[i]));
    return static_cast<float>(sum);
  }

  template <int HD>
  static bool row_major_scores(const ScoreBlock& blk, float* kt) {
    if constexpr (HD >= 128 && HD % 16 == 0) {
      if (!blk.single) {
        const float* qs = blk.qs;
        const int32_t* qpos = blk.qpos;
        const int32_t* qlow = blk.qlow;
        const int32_t* epos = blk.epos;
        const uint16_t* kb = blk.kb;
        const size_t kv_stride = blk.kv_stride, bn = blk.bn;
        const float scale = blk.scale;
        // Long heads: dot_batched itself, entry by entry, on the block's K rows converted
        // once (row-major in kt) with the query's HD/16 registers held: one load per fma,
        // where the transposed loop needs a broadcast too. Eight entries in flight.
        constexpr int kRegs = HD / 16;
        for (size_t j = 0; j < kBlock; ++j)
          for (int k = 0; k < kRegs; ++k)
            _mm512_store_ps(kt + j * HD + 16 * k,
                            j < bn ? load16_f16(kb + j * kv_stride + 16 * k) : _mm512_setzero_ps());
        for (size_t qi = 0; qi < blk.nq; ++qi) {
          __m512 qreg[kRegs];
          for (int k = 0; k < kRegs; ++k) qreg[k] = _mm512_load_ps(qs + qi * HD + 16 * k);
          float* __restrict s = &blk.scores[qi * blk.padded + blk.b0];
          for (size_t j0 = 0; j0 < kBlock; j0 += 8) {
            __m512 acc[8];
            for (int u = 0; u < 8; ++u) acc[u] = _mm512_setzero_ps();
            for (int k = 0; k < kRegs; ++k)
              for (int u = 0; u < 8; ++u)
                acc[u] = _mm512_fmadd_ps(qreg[k], _mm512_load_ps(kt + (j0 + u) * HD + 16 * k), acc[u]);
            // Scaled where visible (qlow < epos <= qpos), -inf where masked.
            const __m256i ep = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(epos + j0));
            const __mmask8 visible = _mm256_cmple_epi32_mask(ep, _mm256_set1_epi32(qpos[qi])) &
                                     _mm256_cmpgt_epi32_mask(ep, _mm256_set1_epi32(qlow[qi]));
            _mm256_storeu_ps(s + j0, _mm256_mask_mul_ps(_mm256_set1_ps(kNegInf), visible, reduce16_x8(acc),
                                                        _mm256_set1_ps(scale)));
          }
        }
        return true;
      }
    }
    return false;
  }

  static bool transposed_scores(const ScoreBlock& blk, size_t qi, const float* kt, int hd) {
    if (blk.single) return false;
    const float* __restrict qv = blk.qs + qi * hd;
    const int32_t* epos = blk.epos;
    const int32_t* qpos = blk.qpos;
    const int32_t* qlow = blk.qlow;
    const float scale = blk.scale;
    // 16 entries at a time, the 16 lanes' fma chains in 16 registers, then reduce16
    // as vertical adds: dot_batched for 16 entries at once.
    float* __restrict s = &blk.scores[qi * blk.padded + blk.b0];
    for (size_t j0 = 0; j0 < kBlock; j0 += 16) {
      __m512 acc[16];
      for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
      for (int c = 0; c < hd; c += 16) {
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t)
          acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(qv[c + t]), _mm512_load_ps(kt + (c + t) * kBlock + j0), acc[t]);
      }
      for (int step = 8; step >= 1; step /= 2)
        for (int i = 0; i < step; ++i) acc[i] = _mm512_add_ps(acc[i], acc[i + step]);
      // Scaled where visible, -inf where masked (the scalar loop, 16 at a time).
      const __m512i ep = _mm512_loadu_si512(epos + j0);
      const __mmask16 visible = _mm512_cmple_epi32_mask(ep, _mm512_set1_epi32(qpos[qi])) &
                                _mm512_cmpgt_epi32_mask(ep, _mm512_set1_epi32(qlow[qi]));
      _mm512_storeu_ps(s + j0, _mm512_mask_mul_ps(_mm512_set1_ps(kNegInf), visible, acc[0], _mm512_set1_ps(scale)));
    }
    return true;
  }

  template <int HD>
  static bool single_lane_pv(const float* __restrict p, const uint16_t* vh, size_t kv_stride, size_t n_entries,
                             size_t t, size_t lanes, float* __restrict acc) {
    if constexpr (HD > 0 && HD % 16 == 0 && HD <= 128) {
      constexpr int kRegs = HD / 16;
      __m512 o[kRegs];
      for (int k = 0; k < kRegs; ++k) o[k] = _mm512_setzero_ps();
      for (size_t e = t; e < n_entries; e += lanes) {
        const float pe = p[e];
        if (pe == 0.f) continue;  // adds an exact zero
        const __m512 pv16 = _mm512_set1_ps(pe);
        const uint16_t* __restrict vr = vh + e * kv_stride;
        for (int k = 0; k < kRegs; ++k) o[k] = _mm512_fmadd_ps(pv16, load16_f16(vr + 16 * k), o[k]);
      }
      for (int k = 0; k < kRegs; ++k) _mm512_storeu_ps(acc + 16 * k, o[k]);
      return true;
    }
    return false;
  }

  static constexpr bool kConvertsVBlock = true;
  template <int HD>
  static size_t block_pv(const PvBlock& blk, size_t qi, const float* __restrict p, float* q_lanes) {
    if constexpr (HD > 0 && HD % 16 == 0 && HD <= 256) {
      float* vt = blk.vt;
      const uint16_t* vb = blk.vb;
      const size_t kv_stride = blk.kv_stride, bn = blk.bn, padded = blk.padded, lanes = blk.lanes, nq = blk.nq;
      const int hd = blk.hd;
      // Lane t's accumulator in HD/16 registers while it takes entries t, t+16, ...,
      // reading the block's V rows converted once (vt) rather than once per query.
      constexpr int kRegs = HD / 16;
      if (qi == 0)
        for (size_t j = 0; j < bn; ++j)
          for (int k = 0; k < kRegs; ++k) _mm512_store_ps(vt + j * HD + 16 * k, load16_f16(vb + j * kv_stride + 16 * k));
      if (qi + 1 < nq) {
        // Two queries per V load, 8 registers of each at a time (the dimensions' fma
        // chains are independent, so each query's order is unchanged).
        constexpr int kChunk = kRegs < 8 ? kRegs : 8;
        const float* __restrict p2 = p + padded;
        float* q_lanes2 = q_lanes + lanes * hd;
        for (size_t t = 0; t < 16 && t < bn; ++t)
          for (int k0 = 0; k0 < kRegs; k0 += kChunk) {
            float* __restrict acc = q_lanes + t * HD + 16 * k0;
            float* __restrict acc2 = q_lanes2 + t * HD + 16 * k0;
            __m512 o[kChunk], o2[kChunk];
            for (int k = 0; k < kChunk; ++k) {
              o[k] = _mm512_loadu_ps(acc + 16 * k);
              o2[k] = _mm512_loadu_ps(acc2 + 16 * k);
            }
            for (size_t j = t; j < bn; j += 16) {
              const __m512 pj = _mm512_set1_ps(p[j]), pj2 = _mm512_set1_ps(p2[j]);
              const float* vj = vt + j * HD + 16 * k0;
              for (int k = 0; k < kChunk; ++k) {
                const __m512 v = _mm512_load_ps(vj + 16 * k);
                o[k] = _mm512_fmadd_ps(pj, v, o[k]);
                o2[k] = _mm512_fmadd_ps(pj2, v, o2[k]);
              }
            }
            for (int k = 0; k < kChunk; ++k) {
              _mm512_storeu_ps(acc + 16 * k, o[k]);
              _mm512_storeu_ps(acc2 + 16 * k, o2[k]);
            }
          }
        return 2;
      }
      for (size_t t = 0; t < 16 && t < bn; ++t) {
        float* __restrict acc = q_lanes + t * HD;
        __m512 o[kRegs];
        for (int k = 0; k < kRegs; ++k) o[k] = _mm512_loadu_ps(acc + 16 * k);
        for (size_t j = t; j < bn; j += 16) {
          const __m512 pj = _mm512_set1_ps(p[j]);
          for (int k = 0; k < kRegs; ++k) o[k] = _mm512_fmadd_ps(pj, _mm512_load_ps(vt + j * HD + 16 * k), o[k]);
        }
        for (int k = 0; k < kRegs; ++k) _mm512_storeu_ps(acc + 16 * k, o[k]);
      }
      return 1;
    }
    return 0;
  }
};

}  // namespace

const RuntimeKernels& runtime_kernels_avx512() { return runtime_kernels_table<Avx512Ops>(); }

namespace {
// Under AMX: every hook AVX-512's, batched attention on tiles where the head dim allows.
struct AmxOps : Avx512Ops {
  // 16 groups of 16 lanes a task: each block's K/V split and V transpose is shared by them
  // (at 48, the AVX-512 default, the AMX kernel was slower than AVX-512's on Qwen 0.5B).
  static constexpr size_t kBatchedTaskQueries = 256;
  static bool batched_tile(const TileArgs& a, std::vector<float>& scratch) {
    return attend_tile_flash_amx(a, scratch) || attend_tile_flash_avx512(a, scratch);
  }
};
}  // namespace

const RuntimeKernels& runtime_kernels_amx() { return runtime_kernels_table<AmxOps>(); }

}  // namespace cf::rk

// The batched attention of attention_flash.h on AVX2: 8 lanes, blocks of 32 entries, 3
// queries per score step (12 accumulators, 3 K vectors and a broadcast in 16 ymm registers;
// the fourth K vector is a memory operand), 2 queries x 4 vectors in P.V (out_block). Lane
// masks are compare results (all-ones lanes), applied by blend and and. Measured on Zen 3
// (bench_attention, 2 threads, 512 rows at the end of 2048 entries, 5 alternated runs,
// median G MAC/s) against the kernel with 2 score queries, the P.V of one query x 8 vectors,
// K transposed by scalar stores and P.V interleaved with the scores: Qwen 1.5B's heads (128)
// 40.5 -> 51.5, Gemma 3's (256) 36.5 -> 43.6, Qwen 0.5B's (64) 41.3 -> 44.8, SmolLM2's
// 41.9 -> 43.3 (the last two within the noise). Then the softmax's exp of x <= 0 with one
// scale (exp8_nonpositive), each V vector loaded once for both P.V queries (pin) and alpha's
// exp skipped when the maximum stays: 41.6 -> 50.9 (64), 47.1 -> 59.8 (128), 49.0 -> 52.6 (256)
// (bench/results/attention_issue57/zen3_20261207b.txt).
#include "runtime/attention_flash.h"
#include "runtime/exp_simd.h"

namespace cf::rk {
namespace {

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  using M = __m256;
  static constexpr int W = 8, kScoreQueries = 3, kAccRegs = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_load_ps(p); }
  static void store(float* p, F v) { _mm256_store_ps(p, v); }
  static void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static I load_i(const int32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static M visible(I e, int32_t pos, int32_t low) {  // low < e <= pos
    const __m256i after = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(pos));
    return _mm256_castsi256_ps(_mm256_andnot_si256(after, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(low))));
  }
  static F masked_max(F mx, M m, F v) { return _mm256_blendv_ps(mx, _mm256_max_ps(mx, v), m); }
  static F maskz(M m, F v) { return _mm256_and_ps(m, v); }
  static float reduce_max(F v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  }
  static float reduce_add(F v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
  static float first(F v) { return _mm256_cvtss_f32(v); }
  static F exp(F v) { return exp8_nonpositive(v); }
  static void pin(F& v) { asm("" : "+x"(v)); }  // one load of each V vector for both queries
  static F cvtph(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void transpose(F r[8]) {  // 8 x 8 floats: unpack pairs, then quads, then halves
    const F t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const F t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const F t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const F t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const F u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const F u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const F u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const F u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
  }
};

}  // namespace

bool attend_tile_flash_avx2(const TileArgs& a, std::vector<float>& scratch) { return flash_attend<Avx2>(a, scratch); }

}  // namespace cf::rk

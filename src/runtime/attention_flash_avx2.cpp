// The batched attention of attention_flash.h on AVX2: 8 lanes, blocks of 32 entries, 2
// queries per score step (8 accumulators, 4 K vectors and a broadcast in 16 ymm
// registers), up to 8 accumulators in P.V (head dims above 64 in chunks of 64). Lane masks
// are compare results (all-ones lanes), applied by blend and and.
#include "runtime/attention_flash.h"
#include "runtime/exp_simd.h"

namespace cf::rk {
namespace {

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  using M = __m256;
  static constexpr int W = 8, kScoreQueries = 2, kAccRegs = 8;
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
  static F exp(F v) { return exp8(v); }
  static F cvtph(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
};

}  // namespace

bool attend_tile_flash_avx2(const TileArgs& a, std::vector<float>& scratch) { return flash_attend<Avx2>(a, scratch); }

}  // namespace cf::rk

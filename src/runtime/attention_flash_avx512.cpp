// The batched attention of attention_flash.h on AVX-512: 16 lanes, blocks of 64 entries,
// 4 queries per score step, up to 16 zmm accumulators in P.V.
// GCC 12 reports its own _mm512_undefined_* helpers as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "runtime/attention_flash.h"
#include "runtime/exp_simd.h"

namespace cf::rk {
namespace {

struct Avx512 {
  using F = __m512;
  using I = __m512i;
  using M = __mmask16;
  static constexpr int W = 16, kScoreQueries = 4, kAccRegs = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, F v) { _mm512_store_ps(p, v); }
  static void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static I load_i(const int32_t* p) { return _mm512_load_si512(p); }
  static M visible(I e, int32_t pos, int32_t low) {
    return _mm512_cmple_epi32_mask(e, _mm512_set1_epi32(pos)) & _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(low));
  }
  static F masked_max(F mx, M m, F v) { return _mm512_mask_max_ps(mx, m, mx, v); }
  static F maskz(M m, F v) { return _mm512_maskz_mov_ps(m, v); }
  static float reduce_max(F v) { return _mm512_reduce_max_ps(v); }
  static float reduce_add(F v) { return _mm512_reduce_add_ps(v); }
  static float first(F v) { return _mm512_cvtss_f32(v); }
  static F exp(F v) { return exp16(v); }
  static F cvtph(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
};

}  // namespace

bool attend_tile_flash_avx512(const TileArgs& a, std::vector<float>& scratch) { return flash_attend<Avx512>(a, scratch); }

}  // namespace cf::rk

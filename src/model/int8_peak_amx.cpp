// AMX tile loops: four independent 16x16 accumulators (tmm0..3) fed by two A and two B
// tiles (tmm4..7), the 2x2 blocking that keeps the tile unit busy. TDPBUSD: 16 x 16 x 64
// int8 multiply-adds; TDPBF16PS: 16 x 16 x 32 BF16 ones. Only called where kernels.cpp
// found AMX usable (the tile state granted).
#include <immintrin.h>

#include <cstring>

#include "model/amx_tiles.h"
#include "model/int8_peak.h"

namespace cf::kern {
namespace {

template <bool Bf16>
double amx_loop(long iterations, int& checksum) {
  static const AmxTileConfig config;
  alignas(64) uint8_t src[16 * 64];
  std::memset(src, 1, sizeof src);
  alignas(64) int32_t out[16 * 16];
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  // Each round does 4 tile products; a round of ten keeps the loop overhead out of the count.
  for (long n = 0; n < iterations / 16; ++n) {
    for (int i = 0; i < 10; ++i) {
      if constexpr (Bf16) {
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      } else {
        _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
      }
    }
  }
  _tile_stored(0, out, 64);
  _tile_release();
  checksum = out[0];
  return static_cast<double>(iterations / 16) * 10 * 4 * 16 * 16 * (Bf16 ? 32 : 64);
}

}  // namespace

double int8_peak_loop_amx(long iterations, int& checksum) { return amx_loop<false>(iterations, checksum); }
double bf16_peak_loop_amx(long iterations, int& checksum) { return amx_loop<true>(iterations, checksum); }

}  // namespace cf::kern

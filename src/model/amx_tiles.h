// The tile configuration every AMX loop here loads (LDTILECFG): palette 1, tiles 0..7 each
// 16 rows x 64 bytes (C: 16 x 16 fp32 or int32; A: 16 x 32 BF16 or 64 int8; B: 16 pair or
// quad rows x 64 bytes). Used by kernels_panel_amx.cpp and int8_peak_amx.cpp.
#pragma once
#include <cstdint>

namespace cf::kern {

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AmxTileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = 16;
    }
  }
};
static_assert(sizeof(AmxTileConfig) == 64);

}  // namespace cf::kern

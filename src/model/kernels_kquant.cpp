// K-quant super-tiles: the Q8_K activation record and the portable kernel, which defines
// the float sequence every ISA reproduces (kernels_impl.h: llama.cpp's AVX2 vec-dot of
// Q4_K/Q5_K/Q6_K with Q8_K, so that K-quant files give llama.cpp's logits bit for bit).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/kernels.h"
#include "model/kernels_impl.h"

namespace cf::kern {

float quantize_q8_k_block(const float* x, int8_t* q) {
  float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, with its sign
  for (size_t j = 0; j < kQK_K; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  if (amax == 0.0f) {
    std::memset(q, 0, kQK_K);
    return 0.0f;
  }
  const float iscale = -127.0f / max;
  // Round half to even by adding 1.5 * 2^23 (exact for |v| < 2^22, here <= 127): the same
  // integers as nearbyint, but a loop the compiler vectorizes (nearbyintf is a libm call).
  for (size_t j = 0; j < kQK_K; ++j) {
    const float shifted = iscale * x[j] + 12582912.0f;
    int32_t bits;
    std::memcpy(&bits, &shifted, 4);
    q[j] = static_cast<int8_t>(std::min(127, (bits & 0x007fffff) - 0x00400000));
  }
  return 1.0f / iscale;
}

void quantize_q8_k_record(const float* x, size_t cols, uint8_t* out) {
  const size_t nb = cols / kQK;
  const auto [qs, dv, bs16] = q8k_record(out, nb);
  for (size_t sb = 0; sb < nb / 8; ++sb) dv[sb] = quantize_q8_k_block(x + sb * kQK_K, qs + sb * kQK_K);
  for (size_t i = 0; i < 2 * nb; ++i) {
    int sum = 0;
    for (size_t j = 0; j < 16; ++j) sum += qs[16 * i + j];
    bs16[i] = sum;
  }
  fill_q8k_pairs(out, nb);
}

namespace {

template <KQuant Q>
void ktile_portable(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
                    size_t y_stride, unsigned o_lo, unsigned o_hi) {
  constexpr KTileGeom G = ktile_geom(Q);
  const size_t nsb = nb / 8;
  for (size_t r = 0; r < nr; ++r) {
    const int8_t* xq = a.qs(r0 + r);
    const float* xd = a.kd(r0 + r);
    const int32_t* bs16 = a.kbs16(r0 + r);
    float lane[kTileRows][8] = {}, accm[kTileRows][4] = {}, summs[kTileRows] = {};
    for (size_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* t = tile + sb * G.bytes;
      for (unsigned o = 0; o < kTileRows; ++o) {
        int32_t S[8] = {};
        if constexpr (Q == KQuant::Q6)  // the -32 offset, lane g taking block g's share
          for (int g = 0; g < 8; ++g)
            S[g] = -32 * (static_cast<int8_t>(t[G.sc + 16 * g + o]) * bs16[16 * sb + 2 * g] +
                          static_cast<int8_t>(t[G.sc_hi + 16 * g + o]) * bs16[16 * sb + 2 * g + 1]);
        for (size_t c = 0; c < 8; ++c) {
          const size_t b = sb * 8 + c;
          const int8_t* q = xq + b * kQK;
          for (int g = 0; g < 8; ++g) {
            int isum = 0;
            for (int j = 0; j < 4; ++j) isum += nib_block_value<G.high_bits>(t + G.block * c, o, 4 * g + j) * q[4 * g + j];
            const int sc = Q == KQuant::Q6 ? static_cast<int8_t>(t[(g < 4 ? G.sc : G.sc_hi) + 16 * c + o])
                                           : t[G.sc + 16 * c + o];
            S[g] += sc * isum;
          }
        }
        int32_t mb[8] = {};
        if constexpr (Q != KQuant::Q6)
          for (size_t j = 0; j < 8; ++j) mb[j] = t[G.m + 16 * j + o] * (bs16[16 * sb + 2 * j] + bs16[16 * sb + 2 * j + 1]);
        const float dd = xd[sb] * fp16_to_fp32(load_u16(t + G.d + 2 * o));
        for (int g = 0; g < 8; ++g) lane[o][g] = std::fma(dd, static_cast<float>(S[g]), lane[o][g]);
        if constexpr (Q != KQuant::Q6) {
          const float dmin = -xd[sb] * fp16_to_fp32(load_u16(t + G.dmin + 2 * o));
          if constexpr (Q == KQuant::Q4) {
            for (int i = 0; i < 4; ++i) accm[o][i] = std::fma(dmin, static_cast<float>(mb[2 * i] + mb[2 * i + 1]), accm[o][i]);
          } else {
            int32_t tot = 0;
            for (int j = 0; j < 8; ++j) tot += mb[j];
            summs[o] = std::fma(dmin, static_cast<float>(tot), summs[o]);
          }
        }
      }
    }
    for (unsigned o = o_lo; o < o_hi; ++o) {
      float v = hsum8_llama(lane[o]);
      if (Q == KQuant::Q4) v += (accm[o][0] + accm[o][2]) + (accm[o][1] + accm[o][3]);
      if (Q == KQuant::Q5) v += summs[o];
      y[r * y_stride + o] = v;
    }
  }
}

}  // namespace

TileKernelFn kquant_tile_portable(KQuant q) {
  switch (q) {
    case KQuant::Q4: return ktile_portable<KQuant::Q4>;
    case KQuant::Q5: return ktile_portable<KQuant::Q5>;
    case KQuant::Q6: break;
  }
  return ktile_portable<KQuant::Q6>;
}

}  // namespace cf::kern

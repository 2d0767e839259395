// The panel GEMM's portable kernel (the definition every ISA reproduces, kernels_panel.h),
// the per-thread panel scratch, and which weight types have panels.
#include "model/kernels_panel.h"

#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>

namespace cf::kern {


uint8_t* thread_scratch(int slot, size_t bytes) {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  constexpr int kSlots = 3;
  thread_local std::unique_ptr<uint8_t[], Free> buf[kSlots];
  thread_local size_t cap[kSlots] = {};
  if (slot < 0 || slot >= kSlots) throw std::logic_error("thread_scratch: no such slot");
  if (bytes > cap[slot]) {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (!p) throw std::bad_alloc();
    buf[slot].reset(p);
    cap[slot] = bytes;
  }
  return buf[slot].get();
}

uint8_t* panel_scratch(size_t nb) { return thread_scratch(0, nb * kPanelBlock); }

namespace {

template <GgmlType T>
void panel_tile_portable(const uint8_t* tile, size_t nb, const ActView& a, size_t r0, size_t nr, float* y,
                         size_t y_stride, unsigned o_lo, unsigned o_hi) {
  constexpr PanelType P = panel_type(T);
  uint8_t* panel = panel_scratch(nb);
  panel_unpack_tile(T, tile, nb, panel, panel_fp16x16);
  for (size_t r = 0; r < nr; ++r) {
    const int8_t* xq = a.qs(r0 + r);
    const float* dx = panel_dx(a, r0 + r);
    const float* s = panel_s(a, r0 + r);
    const int32_t* corr = panel_corr(a, r0 + r);
    const int32_t* corr_hi = panel_corr_hi(a, r0 + r);
    for (unsigned o = o_lo; o < o_hi; ++o) {
      float acc = 0.0f;
      for (size_t b = 0; b < nb; ++b) {
        const uint8_t* pb = panel + b * kPanelBlock;
        const int8_t* q = xq + b * kQK;
        int32_t lo = P.kind == PanelKind::Min ? 0 : corr[b];  // elements 0..15 (groups 0..3)
        int32_t hi = P.kind == PanelKind::Sub16 ? corr_hi[b] : 0;
        for (int g = 0; g < 8; ++g)
          for (int j = 0; j < 4; ++j) (g < 4 ? lo : hi) += pb[64 * g + 4 * o + j] * q[4 * g + j];
        if constexpr (P.kind == PanelKind::Sub16) {
          acc = std::fma(static_cast<float>(lo), panel_scale(pb)[o] * dx[b], acc);
          acc = std::fma(static_cast<float>(hi), panel_second(pb)[o] * dx[b], acc);
        } else {
          acc = std::fma(static_cast<float>(lo + hi), panel_scale(pb)[o] * dx[b], acc);
          if constexpr (P.kind == PanelKind::Min) acc = std::fma(panel_second(pb)[o], s[b], acc);
        }
      }
      y[r * y_stride + o] = acc;
    }
  }
}

TileKernelFn portable_tile(GgmlType t) {
  return panel_kernel_for(t, []<GgmlType T>() { return &panel_tile_portable<T>; });
}

}  // namespace

bool has_panel(GgmlType t) { return portable_tile(t) != nullptr; }

const PanelKernels& panel_kernels_portable() {
  static const PanelKernels k{row_major_quantize, portable_tile};
  return k;
}

}  // namespace cf::kern

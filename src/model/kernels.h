// Dot-product kernels over quantized weights and the matrix multiply the forward pass uses.
// Weights stay in their file type (Q4_1, Q8_0, ...); activations are quantized to 8 bits
// per block, then multiplied with integer dot products. Two families:
//  - batched rows (prefill, recomputation: KQuantOrder::Batched, or 8 rows and more) of
//    block-quantized weights take the panel GEMM (kernels_panel.h): whole blocks summed in
//    int32, in an order of our own, held to order-free references by tolerance
//    (docs/ARCHITECTURE.md, "Numerics contract");
//  - one row at a time (decode, PerRow) follows llama.cpp's vec-dot order (kernels_impl.h),
//    as do F16/BF16 weights and the generic path.
// The ISA (AMX, AVX-512 VNNI, AVX2, portable) is chosen once at run time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/ggml_type.h"

namespace cf {

class ThreadPool;

// Which instruction set the kernels use; `detect_isa()` picks the best the CPU has, and
// CHUNKFUSE_ISA=portable|avx2|avx512|amx in the environment caps it (for tests/benchmarks).
// Amx: AVX-512 everywhere, and AMX BF16 tiles for the prefill GEMM (kernels_panel_amx.cpp),
// chosen only when the CPU has AMX-BF16 and the kernel grants this process the tile state.
enum class Isa { Portable, Avx2, Avx512, Amx };
Isa detect_isa();
Isa active_isa();
const char* isa_name(Isa);
void force_isa(Isa);  // tests only: run the same check under each ISA

// Reference conversions (plain C++, exact definitions of each format).
void dequantize_row(GgmlType t, const void* src, float* dst, size_t n);
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);

// A weight matrix W of shape [rows = out_features][cols = in_features], each row stored
// as one row of `type` in the mapped file. `prepare()` may repack the data into a
// kernel-friendly layout (then the mapped pages are no longer needed and are released).
class WeightMatrix {
 public:
  WeightMatrix(GgmlType type, const uint8_t* data, size_t rows, size_t cols);
  ~WeightMatrix();
  WeightMatrix(WeightMatrix&&) noexcept;
  WeightMatrix& operator=(WeightMatrix&&) noexcept;

  GgmlType type() const { return type_; }
  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }

  // Which order a multiply follows: PerRow, llama.cpp's vec-dot (kernels_impl.h); Batched,
  // the panel GEMM for block-quantized weights (kernels_panel.h) and tinyBLAS's order for
  // F16/BF16; ByRowCount, Batched from 8 activation rows on (2 for F16/BF16), else PerRow.
  enum class KQuantOrder { ByRowCount, PerRow, Batched };

  // y[r * y_stride + o] = sum_k W[o][k] * x[r * x_stride + k] for r < n, o < rows.
  // The result of each element does not depend on the thread count, nor on the other rows
  // (given the order).
  void multiply(const float* x, size_t n, size_t x_stride, float* y, size_t y_stride, ThreadPool& pool,
                KQuantOrder order = KQuantOrder::ByRowCount) const;
  // Only output rows [o_begin, o_end) (used for a slice of the vocabulary).
  void multiply_rows(const float* x, size_t n, size_t x_stride, float* y, size_t y_stride,
                     size_t o_begin, size_t o_end, ThreadPool& pool,
                     KQuantOrder order = KQuantOrder::ByRowCount) const;
  // Row o of W as floats (the embedding lookup when W is tied to the token embedding).
  void dequantize_weight_row(size_t o, float* dst) const;

  struct Impl;
 private:
  GgmlType type_;
  size_t rows_, cols_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cf

// Dot-product kernels over quantized weights and the matrix multiply the forward pass uses.
// Weights stay in their file type (Q4_1, Q8_0, ...); activations are quantized to 8 bits
// per block where the weight type calls for it (as llama.cpp does: Q8_1 for Q4_1/Q5_1,
// Q8_0 for Q4_0/Q5_0/Q8_0, Q8_K for the K-quants), then multiplied with integer dot
// products. The ISA (AVX-512 VNNI, AVX2, portable) is chosen once at run time.
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
// CHUNKFUSE_ISA=portable|avx2|avx512 in the environment caps it (for tests/benchmarks).
enum class Isa { Portable, Avx2, Avx512 };
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

  // Which of llama.cpp's two orders K-quant, F16 and BF16 weights follow (model/kernels_impl.h):
  // its vec-dot (PerRow) or its GEMM (Batched: K-quants its tiled GEMM, F16/BF16 tinyBLAS).
  // ByRowCount is llama.cpp's own rule (GEMM from 8 activation rows on for K-quants, from 2
  // for F16/BF16). Other types have one order and ignore this.
  enum class KQuantOrder { ByRowCount, PerRow, Batched };

  // y[r * y_stride + o] = sum_k W[o][k] * x[r * x_stride + k] for r < n, o < rows.
  // The result of each element does not depend on the thread count, nor on the other rows
  // (for K-quants, given the order).
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

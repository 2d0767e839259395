// Tensor element types of the GGUF/ggml file format and their storage geometry.
// Values of GgmlType are the on-disk type ids of the format (do not renumber).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cf {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

struct GgmlTypeInfo {
  std::string_view name;   // "Q4_1"
  uint32_t block_elems;    // elements per block (1 for plain types)
  uint32_t block_bytes;    // bytes per block
  bool supported;          // we can dequantize / multiply it
};

// Geometry of a type id read from a file; nullopt for ids the format does not define.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id);
GgmlTypeInfo ggml_type_info(GgmlType t);  // for a known enum value
std::string_view ggml_type_name(GgmlType t);

// Bytes taken by one row of n elements; n must be a multiple of the block size.
size_t ggml_row_bytes(GgmlType t, size_t n);

}  // namespace cf

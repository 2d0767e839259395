#include "model/ggml_type.h"

#include <stdexcept>
#include <string>

namespace cf {
namespace {
// Block geometry of each format (elements per block, bytes per block).
std::optional<GgmlTypeInfo> lookup(uint32_t id) {
  switch (static_cast<GgmlType>(id)) {
    case GgmlType::F32: return GgmlTypeInfo{"F32", 1, 4, true};
    case GgmlType::F16: return GgmlTypeInfo{"F16", 1, 2, true};
    case GgmlType::BF16: return GgmlTypeInfo{"BF16", 1, 2, true};
    case GgmlType::Q4_0: return GgmlTypeInfo{"Q4_0", 32, 18, true};
    case GgmlType::Q4_1: return GgmlTypeInfo{"Q4_1", 32, 20, true};
    case GgmlType::Q5_0: return GgmlTypeInfo{"Q5_0", 32, 22, true};
    case GgmlType::Q5_1: return GgmlTypeInfo{"Q5_1", 32, 24, true};
    case GgmlType::Q8_0: return GgmlTypeInfo{"Q8_0", 32, 34, true};
    case GgmlType::Q8_1: return GgmlTypeInfo{"Q8_1", 32, 36, false};
    case GgmlType::Q2_K: return GgmlTypeInfo{"Q2_K", 256, 84, false};
    case GgmlType::Q3_K: return GgmlTypeInfo{"Q3_K", 256, 110, false};
    case GgmlType::Q4_K: return GgmlTypeInfo{"Q4_K", 256, 144, true};
    case GgmlType::Q5_K: return GgmlTypeInfo{"Q5_K", 256, 176, true};
    case GgmlType::Q6_K: return GgmlTypeInfo{"Q6_K", 256, 210, true};
    case GgmlType::Q8_K: return GgmlTypeInfo{"Q8_K", 256, 292, false};
    case GgmlType::I8: return GgmlTypeInfo{"I8", 1, 1, false};
    case GgmlType::I16: return GgmlTypeInfo{"I16", 1, 2, false};
    case GgmlType::I32: return GgmlTypeInfo{"I32", 1, 4, false};
    case GgmlType::I64: return GgmlTypeInfo{"I64", 1, 8, false};
    case GgmlType::F64: return GgmlTypeInfo{"F64", 1, 8, false};
  }
  return std::nullopt;
}
}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id) { return lookup(type_id); }

GgmlTypeInfo ggml_type_info(GgmlType t) {
  auto info = lookup(static_cast<uint32_t>(t));
  if (!info) throw std::invalid_argument("unknown ggml type id " + std::to_string(static_cast<uint32_t>(t)));
  return *info;
}

std::string_view ggml_type_name(GgmlType t) {
  auto info = lookup(static_cast<uint32_t>(t));
  return info ? info->name : std::string_view("unknown");
}

size_t ggml_row_bytes(GgmlType t, size_t n) {
  auto info = ggml_type_info(t);
  if (n % info.block_elems != 0)
    throw std::invalid_argument("row of " + std::to_string(n) + " elements is not a whole number of " +
                                std::string(info.name) + " blocks");
  return n / info.block_elems * info.block_bytes;
}

}  // namespace cf

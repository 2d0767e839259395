// GGUF file reader (format versions 2 and 3): the file is memory-mapped read-only and
// validated completely when opened, so every accessor below is bounds-safe afterwards.
// Any defect (truncation, bad magic/version, out-of-range counts, overlapping or
// out-of-file tensor data, bad alignment, unknown types) throws GgufError whose message
// names the file, the byte offset and what is wrong.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/ggml_type.h"

namespace cf {

struct GgufError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class GgufValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

// One metadata value. Arrays keep their element type; string arrays are views into the
// mapped file (valid as long as the GgufFile lives).
struct GgufArray;
using GgufScalar = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float,
                                bool, std::string_view, uint64_t, int64_t, double>;
struct GgufValue {
  GgufValueType type;
  GgufScalar scalar;                    // when type != ARRAY
  std::shared_ptr<GgufArray> array;     // when type == ARRAY
};
struct GgufArray {
  GgufValueType elem_type;
  std::vector<GgufScalar> items;    // when elem_type != ARRAY
  std::vector<GgufArray> nested;    // when elem_type == ARRAY (arrays of arrays)
  size_t size() const { return elem_type == GgufValueType::ARRAY ? nested.size() : items.size(); }
};

struct GgufTensor {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the contiguous (row) length
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint64_t file_offset = 0;    // absolute offset of the data in the file
  const uint8_t* data = nullptr;  // into the mapping

  uint64_t rows() const;       // product of dims[1..]
};

class GgufFile {
 public:
  // Maps and validates `path`; throws GgufError.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Validates an in-memory image (used by the fuzz target and tests). The bytes are
  // copied, so the buffer need not outlive the call.
  static std::unique_ptr<GgufFile> from_bytes(const uint8_t* bytes, size_t size,
                                              const std::string& label = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  // Typed getters: nullopt when absent; GgufError when present with a type that cannot
  // be converted losslessly (e.g. a string where a number is expected).
  std::optional<std::string_view> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;    // any integer type
  std::optional<double> get_float(std::string_view key) const;   // float or integer
  std::optional<bool> get_bool(std::string_view key) const;
  // Array helpers; GgufError if the key is not an array of the right kind.
  std::vector<std::string_view> get_string_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;
  // Throws GgufError naming the tensor when it is missing.
  const GgufTensor& tensor(std::string_view name) const;

  // Human-readable rendering of a value (arrays abbreviated), for `chunkfuse info`.
  static std::string to_string(const GgufValue& v, size_t max_items = 8);

 private:
  GgufFile() = default;
  void parse();
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;              // mmap'd region (nullptr when owned_ is used)
  std::vector<uint8_t> owned_;           // from_bytes copy
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensor> tensors_;
};

}  // namespace cf

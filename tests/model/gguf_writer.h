// A small GGUF writer for tests: builds valid synthetic files (versions 2 and 3, every
// metadata value type, tensors of any type) and, through its override knobs, invalid
// ones for damage tests. Header-only so any test binary can include it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/ggml_type.h"
#include "model/gguf.h"

namespace cf::test {

class GgufWriter {
 public:
  using Bytes = std::vector<uint8_t>;

  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  // --- little-endian encoders, public so tests can hand-craft payloads -----------------
  template <typename T>
  static void put(Bytes& out, T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    out.insert(out.end(), raw, raw + sizeof(T));
  }
  static void put_string(Bytes& out, std::string_view s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  // Payload of an array value: element type, count, then the already-encoded elements.
  static Bytes array_payload(GgufValueType elem, uint64_t count, const Bytes& elements) {
    Bytes out;
    put<uint32_t>(out, static_cast<uint32_t>(elem));
    put<uint64_t>(out, count);
    out.insert(out.end(), elements.begin(), elements.end());
    return out;
  }

  // --- metadata ------------------------------------------------------------------------
  // Any value whose payload is already encoded (also used for hostile payloads).
  GgufWriter& add_raw(std::string_view key, uint32_t type, const Bytes& payload) {
    put_string(kv_, key);
    put<uint32_t>(kv_, type);
    kv_.insert(kv_.end(), payload.begin(), payload.end());
    ++kv_count_;
    return *this;
  }
  template <typename T>
  GgufWriter& add(std::string_view key, GgufValueType type, T v) {
    Bytes p;
    put<T>(p, v);
    return add_raw(key, static_cast<uint32_t>(type), p);
  }
  GgufWriter& add_u8(std::string_view k, uint8_t v) { return add(k, GgufValueType::UINT8, v); }
  GgufWriter& add_i8(std::string_view k, int8_t v) { return add(k, GgufValueType::INT8, v); }
  GgufWriter& add_u16(std::string_view k, uint16_t v) { return add(k, GgufValueType::UINT16, v); }
  GgufWriter& add_i16(std::string_view k, int16_t v) { return add(k, GgufValueType::INT16, v); }
  GgufWriter& add_u32(std::string_view k, uint32_t v) { return add(k, GgufValueType::UINT32, v); }
  GgufWriter& add_i32(std::string_view k, int32_t v) { return add(k, GgufValueType::INT32, v); }
  GgufWriter& add_u64(std::string_view k, uint64_t v) { return add(k, GgufValueType::UINT64, v); }
  GgufWriter& add_i64(std::string_view k, int64_t v) { return add(k, GgufValueType::INT64, v); }
  GgufWriter& add_f32(std::string_view k, float v) { return add(k, GgufValueType::FLOAT32, v); }
  GgufWriter& add_f64(std::string_view k, double v) { return add(k, GgufValueType::FLOAT64, v); }
  GgufWriter& add_bool(std::string_view k, bool v) { return add(k, GgufValueType::BOOL, uint8_t{v}); }
  GgufWriter& add_string(std::string_view k, std::string_view v) {
    Bytes p;
    put_string(p, v);
    return add_raw(k, static_cast<uint32_t>(GgufValueType::STRING), p);
  }
  template <typename T>
  GgufWriter& add_array(std::string_view k, GgufValueType elem, const std::vector<T>& items) {
    Bytes e;
    for (const T& v : items) put<T>(e, v);
    return add_raw(k, static_cast<uint32_t>(GgufValueType::ARRAY), array_payload(elem, items.size(), e));
  }
  GgufWriter& add_string_array(std::string_view k, const std::vector<std::string>& items) {
    Bytes e;
    for (const auto& s : items) put_string(e, s);
    return add_raw(k, static_cast<uint32_t>(GgufValueType::ARRAY),
                   array_payload(GgufValueType::STRING, items.size(), e));
  }
  // Sets general.alignment (as uint32, like the reference writer) and lays tensors out
  // with it.
  GgufWriter& set_alignment(uint32_t alignment) {
    layout_alignment_ = alignment;
    return add_u32("general.alignment", alignment);
  }

  // --- tensors -------------------------------------------------------------------------
  struct Tensor {
    std::string name;
    uint32_t type_id;
    std::vector<uint64_t> dims;
    Bytes data;                      // written at the tensor's offset
    std::optional<uint64_t> offset;  // relative to the data section; auto-placed if unset
  };
  // Adds a tensor whose data is a recognisable byte pattern of the right size.
  GgufWriter& add_tensor(std::string_view name, GgmlType type, std::vector<uint64_t> dims,
                         std::optional<uint64_t> offset = std::nullopt) {
    uint64_t rows = 1;
    for (size_t i = 1; i < dims.size(); ++i) rows *= dims[i];
    const uint64_t n = ggml_row_bytes(type, dims.at(0)) * rows;
    Bytes data(n);
    for (uint64_t i = 0; i < n; ++i) data[i] = static_cast<uint8_t>((i * 31 + tensors_.size() * 7 + 1) & 0xff);
    return add_tensor_raw({std::string(name), static_cast<uint32_t>(type), std::move(dims), std::move(data), offset});
  }
  GgufWriter& add_tensor_raw(Tensor t) {
    tensors_.push_back(std::move(t));
    return *this;
  }

  // --- damage knobs --------------------------------------------------------------------
  std::string magic = "GGUF";
  std::optional<uint64_t> tensor_count_override;
  std::optional<uint64_t> kv_count_override;

  // Offset of the data section in the last build() output.
  uint64_t data_offset() const { return data_offset_; }

  Bytes build() {
    Bytes out(magic.begin(), magic.end());
    put<uint32_t>(out, version_);
    put<uint64_t>(out, tensor_count_override.value_or(tensors_.size()));
    put<uint64_t>(out, kv_count_override.value_or(kv_count_));
    out.insert(out.end(), kv_.begin(), kv_.end());

    // Auto-placed tensors go one after the other, each aligned.
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors_) {
      const uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      next = std::max(next, align(off + t.data.size()));
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      put_string(out, t.name);
      put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) put<uint64_t>(out, d);
      put<uint32_t>(out, t.type_id);
      put<uint64_t>(out, offsets[i]);
    }
    data_offset_ = align(out.size());
    out.resize(data_offset_, 0);
    uint64_t end = data_offset_;
    // Tensors without data (hostile offsets) do not extend the file.
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (!tensors_[i].data.empty()) end = std::max(end, data_offset_ + offsets[i] + tensors_[i].data.size());
    out.resize(end, 0);
    for (size_t i = 0; i < tensors_.size(); ++i)
      std::copy(tensors_[i].data.begin(), tensors_[i].data.end(), out.begin() + static_cast<ptrdiff_t>(data_offset_ + offsets[i]));
    return out;
  }

  static void write_file(const std::string& path, const Bytes& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
  }

 private:
  uint64_t align(uint64_t n) const { return (n + layout_alignment_ - 1) / layout_alignment_ * layout_alignment_; }

  uint32_t version_;
  uint64_t layout_alignment_ = 32;
  Bytes kv_;
  uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
  uint64_t data_offset_ = 0;
};

}  // namespace cf::test

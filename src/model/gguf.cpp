#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <set>
#include <type_traits>

namespace cf {
namespace {

constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kDefaultAlignment = 32;

// Smallest encoding of each construct, used to reject counts the remaining bytes cannot
// possibly hold before anything is allocated for them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;          // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims=0, type, offset
constexpr uint64_t kArrayHeaderBytes = 4 + 8;        // element type, count

std::string_view value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: return "uint8";
    case GgufValueType::INT8: return "int8";
    case GgufValueType::UINT16: return "uint16";
    case GgufValueType::INT16: return "int16";
    case GgufValueType::UINT32: return "uint32";
    case GgufValueType::INT32: return "int32";
    case GgufValueType::FLOAT32: return "float32";
    case GgufValueType::BOOL: return "bool";
    case GgufValueType::STRING: return "string";
    case GgufValueType::ARRAY: return "array";
    case GgufValueType::UINT64: return "uint64";
    case GgufValueType::INT64: return "int64";
    case GgufValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

// Encoded size of one scalar of type t; 0 for strings and arrays (variable length).
uint64_t fixed_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16: case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64: case GgufValueType::INT64: case GgufValueType::FLOAT64: return 8;
    case GgufValueType::STRING: case GgufValueType::ARRAY: return 0;
  }
  return 0;
}

bool is_integer_type(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::UINT16:
    case GgufValueType::INT16: case GgufValueType::UINT32: case GgufValueType::INT32:
    case GgufValueType::UINT64: case GgufValueType::INT64: return true;
    default: return false;
  }
}

bool is_float_type(GgufValueType t) {
  return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

std::string quoted(std::string_view s) {
  // Built by appending: `"'" + std::string(s)` trips GCC 12's -Wrestrict false positive at -O3.
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

// Bounds-checked little-endian cursor over the file image. Every read names the offset it
// failed at, so errors point at the defect rather than at some later symptom.
class Reader {
 public:
  Reader(const uint8_t* base, uint64_t size, const std::string& path)
      : base_(base), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what, uint64_t at) const {
    throw GgufError(path_ + ": " + what + " at offset " + std::to_string(at));
  }
  [[noreturn]] void fail(const std::string& what) const { fail(what, pos_); }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      fail("truncated: " + std::string(what) + " needs " + std::to_string(n) + " bytes but only " +
           std::to_string(remaining()) + " remain");
  }

  template <typename T>
  T read(const char* what) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));  // the format is little-endian, like our hosts
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_string(const char* what) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>(what);
    if (len > remaining())
      fail("truncated: " + std::string(what) + " claims " + std::to_string(len) + " bytes but only " +
               std::to_string(remaining()) + " remain",
           at);
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

  // Rejects `count` items of at least `min_bytes` each when the rest of the file is
  // too short for them (this is what makes huge counts fail before any allocation).
  void check_count(uint64_t count, uint64_t min_bytes, const std::string& what, uint64_t at) const {
    if (min_bytes != 0 && count > remaining() / min_bytes)
      fail(what + " count " + std::to_string(count) + " cannot fit in the remaining " +
               std::to_string(remaining()) + " bytes",
           at);
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

GgufValueType read_value_type(Reader& r, const std::string& context) {
  const uint64_t at = r.pos();
  const auto raw = r.read<uint32_t>("value type");
  if (raw > static_cast<uint32_t>(GgufValueType::FLOAT64))
    r.fail("unknown value type " + std::to_string(raw) + " for " + context, at);
  return static_cast<GgufValueType>(raw);
}

GgufScalar read_scalar(Reader& r, GgufValueType t, const std::string& context) {
  switch (t) {
    case GgufValueType::UINT8: return r.read<uint8_t>("uint8 value");
    case GgufValueType::INT8: return r.read<int8_t>("int8 value");
    case GgufValueType::UINT16: return r.read<uint16_t>("uint16 value");
    case GgufValueType::INT16: return r.read<int16_t>("int16 value");
    case GgufValueType::UINT32: return r.read<uint32_t>("uint32 value");
    case GgufValueType::INT32: return r.read<int32_t>("int32 value");
    case GgufValueType::FLOAT32: return r.read<float>("float32 value");
    case GgufValueType::UINT64: return r.read<uint64_t>("uint64 value");
    case GgufValueType::INT64: return r.read<int64_t>("int64 value");
    case GgufValueType::FLOAT64: return r.read<double>("float64 value");
    case GgufValueType::BOOL: {
      const uint64_t at = r.pos();
      const auto b = r.read<uint8_t>("bool value");
      if (b > 1) r.fail("bool value " + std::to_string(b) + " (not 0 or 1) for " + context, at);
      return b == 1;
    }
    case GgufValueType::STRING: return r.read_string("string value");
    case GgufValueType::ARRAY: break;
  }
  r.fail("internal: scalar read of an array type for " + context);
}

GgufArray read_array(Reader& r, const std::string& context, int depth) {
  const uint64_t at = r.pos();
  if (depth > kMaxArrayDepth)
    r.fail("arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels in " + context, at);
  GgufArray arr;
  arr.elem_type = read_value_type(r, context);
  const uint64_t count_at = r.pos();
  const auto count = r.read<uint64_t>("array length");
  const uint64_t min_elem = arr.elem_type == GgufValueType::STRING  ? 8
                            : arr.elem_type == GgufValueType::ARRAY ? kArrayHeaderBytes
                                                                    : fixed_size(arr.elem_type);
  r.check_count(count, min_elem, "array element (" + std::string(value_type_name(arr.elem_type)) + ") of " + context,
                count_at);
  if (arr.elem_type == GgufValueType::ARRAY) {
    arr.nested.reserve(count);
    for (uint64_t i = 0; i < count; ++i) arr.nested.push_back(read_array(r, context, depth + 1));
  } else {
    arr.items.reserve(count);
    for (uint64_t i = 0; i < count; ++i) arr.items.push_back(read_scalar(r, arr.elem_type, context));
  }
  return arr;
}

// Overflow-checked helpers (the file controls every operand).
bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }
bool add_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_add_overflow(a, b, &out); }

// Escapes control characters so that multi-line values (chat templates) stay on one line.
void append_escaped(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          static constexpr char hex[] = "0123456789abcdef";
          out += "\\x";
          out += hex[(static_cast<unsigned char>(c) >> 4) & 0xf];
          out += hex[static_cast<unsigned char>(c) & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

template <typename F>
void append_number(std::string& out, F v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, res.ptr);
}

void append_scalar(std::string& out, const GgufScalar& s) {
  std::visit(
      [&out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string_view>) append_escaped(out, v);
        else if constexpr (std::is_same_v<T, bool>) out += v ? "true" : "false";
        else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) append_number(out, int{v});
        else append_number(out, v);
      },
      s);
}

void append_array(std::string& out, const GgufArray& a, size_t max_items) {
  const size_t n = a.size();
  const size_t shown = std::min(n, max_items);
  out += '[';
  for (size_t i = 0; i < shown; ++i) {
    if (i) out += ", ";
    if (a.elem_type == GgufValueType::ARRAY) append_array(out, a.nested[i], max_items);
    else append_scalar(out, a.items[i]);
  }
  if (shown < n) {
    if (shown) out += ", ";
    out += "... (" + std::to_string(n) + " items)";
  }
  out += ']';
}

}  // namespace

uint64_t GgufTensor::rows() const {
  uint64_t r = 1;
  for (size_t i = 1; i < dims.size(); ++i) r *= dims[i];
  return r;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw GgufError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw GgufError(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw GgufError(path + ": not a regular file");
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps the file alive
    if (m == MAP_FAILED) throw GgufError(path + ": cannot mmap: " + std::strerror(err));
    f->mapping_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
  } else {
    ::close(fd);
  }
  f->parse();
  return f;
}

std::unique_ptr<GgufFile> GgufFile::from_bytes(const uint8_t* bytes, size_t size, const std::string& label) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = label;
  f->owned_.assign(bytes, bytes + size);
  f->base_ = f->owned_.data();
  f->size_ = size;
  f->parse();
  return f;
}

GgufFile::~GgufFile() {
  if (mapping_) ::munmap(mapping_, size_);
}

namespace {

using KvMap = std::map<std::string, GgufValue, std::less<>>;

struct HeaderCounts {
  uint64_t tensors = 0, tensors_at = 0;  // the tensor count and where it was read
  uint64_t kv = 0;
};

// Magic, version (2 or 3, little-endian) and the two counts, each checked against what the
// rest of the file can hold.
HeaderCounts read_header(Reader& r, const uint8_t* base, uint32_t& version) {
  r.need(4, "magic");
  if (std::memcmp(base, "GGUF", 4) != 0) r.fail("bad magic (not a GGUF file)", 0);
  r.read<uint32_t>("magic");
  const uint64_t version_at = r.pos();
  version = r.read<uint32_t>("version");
  if (version == 1) r.fail("GGUF version 1 is not supported (only versions 2 and 3); re-convert the model", version_at);
  if (version == 0x02000000 || version == 0x03000000)
    r.fail("big-endian GGUF files are not supported", version_at);
  if (version != 2 && version != 3)
    r.fail("unsupported GGUF version " + std::to_string(version) + " (only 2 and 3)", version_at);
  HeaderCounts c;
  c.tensors_at = r.pos();
  c.tensors = r.read<uint64_t>("tensor count");
  const uint64_t kv_count_at = r.pos();
  c.kv = r.read<uint64_t>("metadata count");
  r.check_count(c.kv, kMinKvBytes, "metadata", kv_count_at);
  // Tensor infos follow the metadata, so the kv minimum is part of what they must share.
  if (c.tensors > (r.remaining() - c.kv * kMinKvBytes) / kMinTensorInfoBytes)
    r.fail("tensor count " + std::to_string(c.tensors) + " cannot fit in the remaining " +
               std::to_string(r.remaining()) + " bytes",
           c.tensors_at);
  return c;
}

// `count` key/value pairs into `kv` (a duplicate key is an error); returns where the key
// general.alignment was read (0: absent), for its error messages.
uint64_t read_metadata(Reader& r, uint64_t count, KvMap& kv) {
  uint64_t alignment_key_at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t key_at = r.pos();
    const std::string_view key = r.read_string("metadata key");
    if (key == "general.alignment") alignment_key_at = key_at;
    const std::string context = "metadata key " + quoted(key);
    if (kv.find(key) != kv.end()) r.fail("duplicate " + context, key_at);
    GgufValue v;
    v.type = read_value_type(r, context);
    if (v.type == GgufValueType::ARRAY) v.array = std::make_shared<GgufArray>(read_array(r, context, 1));
    else v.scalar = read_scalar(r, v.type, context);
    kv.emplace(std::string(key), std::move(v));
  }
  return alignment_key_at;
}

// One tensor info: unique name, 1 to kMaxDims non-zero dimensions whose product fits, a known
// type whose block divides the row, a byte size that fits, an offset on the alignment (kept
// relative in file_offset). `offset_at` gets where the offset was read.
GgufTensor read_tensor_info(Reader& r, uint64_t alignment, std::set<std::string_view>& names, uint64_t& offset_at) {
  const uint64_t info_at = r.pos();
  const std::string_view name = r.read_string("tensor name");
  const std::string tname = "tensor " + quoted(name);
  if (!names.insert(name).second) r.fail("duplicate " + tname, info_at);
  GgufTensor t;
  t.name = std::string(name);
  const uint64_t ndims_at = r.pos();
  const auto n_dims = r.read<uint32_t>("tensor n_dims");
  if (n_dims == 0 || n_dims > kMaxDims)
    r.fail(tname + " has " + std::to_string(n_dims) + " dimensions (1 to " + std::to_string(kMaxDims) +
               " allowed)",
           ndims_at);
  uint64_t n_elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t dim_at = r.pos();
    const auto dim = r.read<uint64_t>("tensor dimension");
    if (dim == 0) r.fail(tname + " has dimension " + std::to_string(d) + " equal to zero", dim_at);
    if (mul_overflows(n_elements, dim, n_elements) || n_elements > uint64_t{std::numeric_limits<int64_t>::max()})
      r.fail(tname + " element count overflows (dimension " + std::to_string(d) + " = " + std::to_string(dim) + ")",
             dim_at);
    t.dims.push_back(dim);
  }
  t.n_elements = n_elements;
  const uint64_t type_at = r.pos();
  const auto type_id = r.read<uint32_t>("tensor type");
  const auto info = ggml_type_info(type_id);
  if (!info) r.fail(tname + " has unknown type id " + std::to_string(type_id), type_at);
  t.type = static_cast<GgmlType>(type_id);
  if (t.dims[0] % info->block_elems != 0)
    r.fail(tname + " row length " + std::to_string(t.dims[0]) + " is not a multiple of the " +
               std::string(info->name) + " block size " + std::to_string(info->block_elems),
           ndims_at);
  const uint64_t row_bytes = ggml_row_bytes(t.type, t.dims[0]);
  if (mul_overflows(row_bytes, t.rows(), t.n_bytes))
    r.fail(tname + " byte size overflows", ndims_at);
  offset_at = r.pos();
  const auto rel = r.read<uint64_t>("tensor offset");
  if (rel % alignment != 0)
    r.fail(tname + " data offset " + std::to_string(rel) + " is not a multiple of the alignment " +
               std::to_string(alignment),
           offset_at);
  t.file_offset = rel;  // made absolute once the data section's start is known
  return t;
}

// Makes every tensor's offset absolute (data section + relative offset) and points it into
// the mapping; its whole range must lie inside the file.
void place_tensor_data(Reader& r, std::vector<GgufTensor>& tensors, const std::vector<uint64_t>& offsets_at,
                       uint64_t data_offset, const uint8_t* base, uint64_t file_size) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    GgufTensor& t = tensors[i];
    uint64_t abs, end;
    if (add_overflows(data_offset, t.file_offset, abs) || add_overflows(abs, t.n_bytes, end))
      r.fail("tensor " + quoted(t.name) + " data range overflows", offsets_at[i]);
    if (end > file_size)
      r.fail("truncated: tensor " + quoted(t.name) + " data ends at byte " + std::to_string(end) +
                 " but the file has " + std::to_string(file_size) + " bytes",
             offsets_at[i]);
    t.file_offset = abs;
    t.data = base + abs;
  }
}

// Tensors' data must not overlap, and each must fill its span: writers (gguf-py, llama.cpp)
// place tensors back to back, padded to the alignment, so the bytes up to the next tensor (or
// the end of the file) exceed the size by less than the alignment. A larger gap means the type
// or shape was changed (issue 17: Q4_1 relabelled Q4_0 loads, reads the wrong bytes and answers
// garbage), so it is an error naming the tensor.
void check_tensor_spans(Reader& r, const std::vector<GgufTensor>& tensors, const std::vector<uint64_t>& offsets_at,
                        uint64_t alignment, uint64_t file_size) {
  // Sorted by where their data starts.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&tensors](size_t a, size_t b) { return tensors[a].file_offset < tensors[b].file_offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensor& prev = tensors[order[k - 1]];
    const GgufTensor& cur = tensors[order[k]];
    if (prev.file_offset + prev.n_bytes > cur.file_offset)
      r.fail("tensor " + quoted(cur.name) + " data overlaps tensor " + quoted(prev.name) + " (bytes " +
                 std::to_string(cur.file_offset) + " < " + std::to_string(prev.file_offset + prev.n_bytes) + ")",
             offsets_at[order[k]]);
  }
  for (size_t k = 0; k < order.size(); ++k) {
    const GgufTensor& t = tensors[order[k]];
    const uint64_t next = k + 1 < order.size() ? tensors[order[k + 1]].file_offset : file_size;
    const uint64_t span = next - t.file_offset;
    if (span - t.n_bytes >= alignment)
      r.fail("tensor " + quoted(t.name) + " is " + std::to_string(t.n_bytes) + " bytes by its type " +
                 std::string(ggml_type_name(t.type)) + " and shape, but its data spans " + std::to_string(span) + " bytes up to " +
                 (k + 1 < order.size() ? "tensor " + quoted(tensors[order[k + 1]].name) : std::string("the end of the file")) +
                 " (wrong type or shape?)",
             offsets_at[order[k]]);
  }
}

}  // namespace

void GgufFile::parse() {
  Reader r(base_, size_, path_);
  const HeaderCounts counts = read_header(r, base_, version_);
  const uint64_t alignment_key_at = read_metadata(r, counts.kv, kv_);

  if (const GgufValue* a = find("general.alignment")) {
    if (!is_integer_type(a->type)) r.fail("general.alignment is a " + std::string(value_type_name(a->type)) +
                                              ", expected an integer", alignment_key_at);
    const int64_t align = *get_int("general.alignment");
    if (align <= 0 || !std::has_single_bit(static_cast<uint64_t>(align)))
      r.fail("general.alignment " + std::to_string(align) + " is not a positive power of two", alignment_key_at);
    alignment_ = static_cast<uint64_t>(align);
  } else {
    alignment_ = kDefaultAlignment;
  }

  r.check_count(counts.tensors, kMinTensorInfoBytes, "tensor", counts.tensors_at);
  tensors_.reserve(counts.tensors);
  std::set<std::string_view> names;  // views into the mapping, which outlives the set
  std::vector<uint64_t> offsets_at;   // where each tensor's offset was read, for errors
  offsets_at.reserve(counts.tensors);
  for (uint64_t i = 0; i < counts.tensors; ++i) {
    uint64_t offset_at = 0;
    tensors_.push_back(read_tensor_info(r, alignment_, names, offset_at));
    offsets_at.push_back(offset_at);
  }

  // The data section starts at the next multiple of the alignment.
  uint64_t padded;
  if (add_overflows(r.pos(), alignment_ - 1, padded)) r.fail("data section offset overflows");
  data_offset_ = padded / alignment_ * alignment_;
  place_tensor_data(r, tensors_, offsets_at, data_offset_, base_, size_);
  check_tensor_spans(r, tensors_, offsets_at, alignment_, size_);
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
[[noreturn]] void type_mismatch(const std::string& path, std::string_view key, const GgufValue& v,
                                const char* expected) {
  std::string actual(value_type_name(v.type));
  if (v.type == GgufValueType::ARRAY && v.array)
    actual = "array of " + std::string(value_type_name(v.array->elem_type));
  throw GgufError(path + ": metadata key " + quoted(key) + " is " + actual + ", expected " + expected);
}

// Integer value of a scalar of integer type, or nullopt when it does not fit in int64.
std::optional<int64_t> scalar_to_int(const GgufScalar& s) {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > uint64_t{std::numeric_limits<int64_t>::max()}) return std::nullopt;
          return static_cast<int64_t>(v);
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<int64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      s);
}

double scalar_to_double(const GgufScalar& s) {
  return std::visit(
      [](const auto& v) -> double {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_arithmetic_v<T>) return static_cast<double>(v);
        else return 0.0;
      },
      s);
}
}  // namespace

std::optional<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::STRING) type_mismatch(path_, key, *v, "string");
  return std::get<std::string_view>(v->scalar);
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer_type(v->type)) type_mismatch(path_, key, *v, "an integer");
  auto i = scalar_to_int(v->scalar);
  if (!i) throw GgufError(path_ + ": metadata key " + quoted(key) + " value does not fit in int64");
  return i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!is_float_type(v->type) && !is_integer_type(v->type)) type_mismatch(path_, key, *v, "a number");
  return scalar_to_double(v->scalar);
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::BOOL) type_mismatch(path_, key, *v, "bool");
  return std::get<bool>(v->scalar);
}

std::vector<std::string_view> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) throw GgufError(path_ + ": metadata key " + quoted(key) + " is missing");
  if (v->type != GgufValueType::ARRAY || v->array->elem_type != GgufValueType::STRING)
    type_mismatch(path_, key, *v, "array of string");
  std::vector<std::string_view> out;
  out.reserve(v->array->items.size());
  for (const auto& s : v->array->items) out.push_back(std::get<std::string_view>(s));
  return out;
}

std::vector<double> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) throw GgufError(path_ + ": metadata key " + quoted(key) + " is missing");
  if (v->type != GgufValueType::ARRAY ||
      !(is_float_type(v->array->elem_type) || is_integer_type(v->array->elem_type)))
    type_mismatch(path_, key, *v, "array of numbers");
  std::vector<double> out;
  out.reserve(v->array->items.size());
  for (const auto& s : v->array->items) out.push_back(scalar_to_double(s));
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) throw GgufError(path_ + ": metadata key " + quoted(key) + " is missing");
  if (v->type != GgufValueType::ARRAY || !is_integer_type(v->array->elem_type))
    type_mismatch(path_, key, *v, "array of integers");
  std::vector<int64_t> out;
  out.reserve(v->array->items.size());
  for (const auto& s : v->array->items) {
    auto i = scalar_to_int(s);
    if (!i) throw GgufError(path_ + ": metadata key " + quoted(key) + " has an element that does not fit in int64");
    out.push_back(*i);
  }
  return out;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) throw GgufError(path_ + ": tensor " + quoted(name) + " not found");
  return *t;
}

std::string GgufFile::to_string(const GgufValue& v, size_t max_items) {
  std::string out;
  if (v.type == GgufValueType::ARRAY) {
    if (v.array) append_array(out, *v.array, max_items);
  } else {
    append_scalar(out, v.scalar);
  }
  return out;
}

}  // namespace cf

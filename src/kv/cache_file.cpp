#include "kv/cache_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "base/bounded_json.h"
#include "base/enum_names.h"
#include "kv/entry_auth.h"
#include "kv/store_paths.h"
#include "model/kernels.h"

namespace cf {
namespace {

// Header field offsets (see cache_file.h).
constexpr size_t kOffVersion = 8, kOffHeaderSize = 12, kOffFingerprint = 16, kOffDtype = 24, kOffLayers = 28,
                 kOffKvHeads = 32, kOffHeadDim = 36, kOffTokens = 40, kOffKeyId = 48, kOffMetaLen = 64,
                 kOffPayloadLen = 72, kOffBodySum = 80, kOffHeaderSum = 88;
constexpr char kMagic[8] = {'C', 'F', 'K', 'V', 'C', 'A', 'C', 'H'};
constexpr size_t kPayloadAlign = 64;

template <class T>
void store_le(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}
template <class T>
T load_le(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

uint64_t header_checksum(const uint8_t* header) {
  uint8_t h[kCacheFileHeaderSize];
  std::memcpy(h, header, sizeof h);
  std::memset(h + kOffHeaderSum, 0, 8);
  return XXH3_64bits(h, sizeof h);
}

bool valid_dtype(uint32_t d) { return d <= static_cast<uint32_t>(KvDtype::bf16); }

std::string errno_text() { return std::strerror(errno); }

// Read-only mapping of a whole file, unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw CacheFileError(errno == ENOENT ? CacheFileDefect::not_found : CacheFileDefect::io_error, path,
                           "cannot open: " + errno_text());
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail_io("cannot stat");
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) return;  // mmap rejects empty files; the caller reports truncation
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) fail_io("cannot map");
    data_ = static_cast<const uint8_t*>(p);
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  [[noreturn]] void fail_io(const char* what) {
    const std::string msg = std::string(what) + ": " + errno_text();
    ::close(fd_);
    fd_ = -1;
    throw CacheFileError(CacheFileDefect::io_error, path_, msg);
  }
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// The header fields, checked against each other and the file size.
struct Parsed {
  uint64_t fingerprint;
  KvDtype dtype;
  int n_layers, n_kv_heads, head_dim;
  size_t n_tokens;
  Hash128 key;
  size_t meta_off, meta_len, payload_off, payload_len;
  size_t entry_size;     // bytes the header accounts for; an HMAC trailer may follow
  bool has_tag = false;  // an EntryAuth trailer follows the entry
  nlohmann::json meta;
};

// A file image in memory: a mapped file or bytes from the remote tier.
struct Image {
  const uint8_t* p;
  size_t n;
  const uint8_t* data() const { return p; }
  size_t size() const { return n; }
};

Parsed parse(const Image& f, const std::string& path) {
  auto fail = [&](CacheFileDefect d, const std::string& detail) { throw CacheFileError(d, path, detail); };
  const uint8_t* p = f.data();
  if (f.size() < kCacheFileHeaderSize)
    fail(CacheFileDefect::truncated, std::to_string(f.size()) + " bytes, shorter than the header");
  if (std::memcmp(p, kMagic, 8) != 0) fail(CacheFileDefect::bad_magic, "not a chunkfuse KV cache file");
  const uint32_t version = load_le<uint32_t>(p + kOffVersion);
  if (version != kCacheFileVersion)
    fail(CacheFileDefect::wrong_version, "format version " + std::to_string(version) + ", this build reads " +
                                             std::to_string(kCacheFileVersion));
  if (load_le<uint32_t>(p + kOffHeaderSize) != kCacheFileHeaderSize)
    fail(CacheFileDefect::wrong_version, "header size " + std::to_string(load_le<uint32_t>(p + kOffHeaderSize)));
  if (header_checksum(p) != load_le<uint64_t>(p + kOffHeaderSum))
    fail(CacheFileDefect::checksum_mismatch, "header checksum differs");

  Parsed r;
  r.fingerprint = load_le<uint64_t>(p + kOffFingerprint);
  const uint32_t dtype = load_le<uint32_t>(p + kOffDtype);
  if (!valid_dtype(dtype)) fail(CacheFileDefect::bad_header, "unknown dtype " + std::to_string(dtype));
  r.dtype = static_cast<KvDtype>(dtype);
  const uint32_t layers = load_le<uint32_t>(p + kOffLayers), heads = load_le<uint32_t>(p + kOffKvHeads),
                 hdim = load_le<uint32_t>(p + kOffHeadDim);
  const uint64_t n = load_le<uint64_t>(p + kOffTokens), meta_len = load_le<uint64_t>(p + kOffMetaLen),
                 payload_len = load_le<uint64_t>(p + kOffPayloadLen);
  // Bounds keep the size arithmetic below far from overflow.
  if (layers == 0 || layers > 4096 || heads == 0 || heads > 4096 || hdim == 0 || hdim > 4096 || n == 0 ||
      n > (uint64_t{1} << 32) || meta_len > (uint64_t{1} << 32))
    fail(CacheFileDefect::bad_header, "implausible dims or lengths");
  r.n_layers = static_cast<int>(layers);
  r.n_kv_heads = static_cast<int>(heads);
  r.head_dim = static_cast<int>(hdim);
  r.n_tokens = n;
  const uint64_t want_payload = 2ull * layers * n * heads * hdim * dtype_size(r.dtype);
  if (payload_len != want_payload)
    fail(CacheFileDefect::bad_header, "payload length " + std::to_string(payload_len) + " does not match the dims (" +
                                          std::to_string(want_payload) + ")");
  std::memcpy(r.key.data(), p + kOffKeyId, 16);
  r.meta_off = kCacheFileHeaderSize + 8 * n;
  r.meta_len = meta_len;
  r.payload_off = align_up(r.meta_off + meta_len, kPayloadAlign);
  r.payload_len = payload_len;
  const size_t want_size = r.payload_off + payload_len;
  if (f.size() < want_size)
    fail(CacheFileDefect::truncated,
         std::to_string(f.size()) + " bytes, the header says " + std::to_string(want_size));
  r.entry_size = want_size;
  r.has_tag = f.size() == want_size + EntryAuth::kTrailerBytes && EntryAuth::has_trailer(p, f.size());
  if (f.size() > want_size && !r.has_tag)
    fail(CacheFileDefect::size_mismatch,
         std::to_string(f.size()) + " bytes, the header says " + std::to_string(want_size));
  return r;
}

void parse_meta(const Image& f, Parsed& r, const std::string& path) {
  try {
    r.meta = parse_json_bounded(std::string_view(reinterpret_cast<const char*>(f.data()) + r.meta_off, r.meta_len));
    if (!r.meta.is_object() || !r.meta.at("variant").is_object())
      throw std::runtime_error("not an object with a variant");
  } catch (const std::exception& e) {
    throw CacheFileError(CacheFileDefect::bad_metadata, path, e.what());
  }
}

KeyContext meta_variant(const nlohmann::json& meta, const std::string& path) {
  KeyContext v;
  const auto& jv = meta.at("variant");
  if (!jv.at("kind").is_string() || !parse_context_kind(jv.at("kind").get<std::string>(), v.kind) ||
      !jv.at("context_hash").is_string() || !parse_hash128_hex(jv.at("context_hash").get<std::string>(), v.context_hash))
    throw CacheFileError(CacheFileDefect::bad_metadata, path, "bad variant");
  return v;
}

}  // namespace

constexpr EnumName<KvDtype> kDtypeNames[] = {{KvDtype::f32, "f32"}, {KvDtype::f16, "f16"}, {KvDtype::bf16, "bf16"}};

const char* dtype_name(KvDtype d) { return enum_name(kDtypeNames, d); }

bool parse_dtype(std::string_view s, KvDtype& out) { return parse_enum_name(kDtypeNames, s, out); }

size_t dtype_size(KvDtype d) { return d == KvDtype::f32 ? 4 : 2; }

uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep it a (quiet) NaN
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

void round_to_dtype(KvCache& kv, KvDtype d) {
  // The cache holds f16, which f32 and f16 files keep exactly; only bf16 rounds (and the
  // bf16 value is stored back as f16, as reading a bf16 file stores it).
  if (d != KvDtype::bf16 || kv.size() == 0) return;
  std::vector<float> row(kv.size() * kv.kv_dim());
  for (int l = 0; l < kv.n_layers(); ++l)
    for (bool is_k : {true, false}) {
      is_k ? kv.read_k(l, 0, kv.size(), row.data()) : kv.read_v(l, 0, kv.size(), row.data());
      for (float& x : row) x = bf16_to_fp32(fp32_to_bf16(x));
      is_k ? kv.write_k(l, 0, kv.size(), row.data()) : kv.write_v(l, 0, kv.size(), row.data());
    }
}

const char* defect_name(CacheFileDefect d) {
  switch (d) {
    case CacheFileDefect::not_found: return "not found";
    case CacheFileDefect::io_error: return "I/O error";
    case CacheFileDefect::truncated: return "truncated";
    case CacheFileDefect::size_mismatch: return "size mismatch";
    case CacheFileDefect::unauthenticated: return "unauthenticated";
    case CacheFileDefect::bad_magic: return "bad magic";
    case CacheFileDefect::wrong_version: return "wrong version";
    case CacheFileDefect::bad_header: return "bad header";
    case CacheFileDefect::checksum_mismatch: return "checksum mismatch";
    case CacheFileDefect::foreign_model: return "foreign model";
    case CacheFileDefect::shape_mismatch: return "shape mismatch";
    case CacheFileDefect::bad_metadata: return "bad metadata";
    case CacheFileDefect::key_mismatch: return "key mismatch";
  }
  return "?";
}

CacheFileError::CacheFileError(CacheFileDefect reason, std::string path, const std::string& detail)
    : std::runtime_error(path + ": " + defect_name(reason) + (detail.empty() ? "" : ": " + detail)),
      reason_(reason),
      path_(std::move(path)) {}

std::vector<uint8_t> encode_cache_file(const ChunkCache& c, KvDtype dtype) {
  const KvCache& kv = c.kv;
  const ModelHparams& h = kv.hparams();
  const size_t n = kv.size();
  if (n == 0 || n != c.key.tokens().size())
    throw std::invalid_argument("encode_cache_file: the cache holds " + std::to_string(n) + " entries for " +
                                std::to_string(c.key.tokens().size()) + " tokens");
  nlohmann::json meta = {
      {"key_id", c.key.id()},
      {"variant", {{"kind", context_kind_name(c.key.context().kind)},
                   {"context_hash", hash128_hex(c.key.context().context_hash)}}},
      {"offline_ms", c.offline_ms},
      {"created_unix_ms", c.created_unix_ms},
      {"extra", c.extra},
  };
  const std::string meta_text = meta.dump();
  const size_t kv_dim = static_cast<size_t>(kv.kv_dim()), es = dtype_size(dtype);
  const size_t meta_off = kCacheFileHeaderSize + 8 * n;
  const size_t payload_off = align_up(meta_off + meta_text.size(), kPayloadAlign);
  const size_t payload_len = 2 * static_cast<size_t>(kv.n_layers()) * n * kv_dim * es;
  std::vector<uint8_t> b(payload_off + payload_len, 0);

  uint8_t* p = b.data();
  std::memcpy(p, kMagic, 8);
  store_le<uint32_t>(p + kOffVersion, kCacheFileVersion);
  store_le<uint32_t>(p + kOffHeaderSize, kCacheFileHeaderSize);
  store_le<uint64_t>(p + kOffFingerprint, c.key.model_fingerprint());
  store_le<uint32_t>(p + kOffDtype, static_cast<uint32_t>(dtype));
  store_le<uint32_t>(p + kOffLayers, static_cast<uint32_t>(kv.n_layers()));
  store_le<uint32_t>(p + kOffKvHeads, static_cast<uint32_t>(h.n_kv_heads));
  store_le<uint32_t>(p + kOffHeadDim, static_cast<uint32_t>(h.head_dim));
  store_le<uint64_t>(p + kOffTokens, n);
  std::memcpy(p + kOffKeyId, c.key.hash().data(), 16);
  store_le<uint64_t>(p + kOffMetaLen, meta_text.size());
  store_le<uint64_t>(p + kOffPayloadLen, payload_len);

  for (size_t i = 0; i < n; ++i) {
    store_le<uint32_t>(p + kCacheFileHeaderSize + 4 * i, static_cast<uint32_t>(c.key.tokens()[i]));
    store_le<uint32_t>(p + kCacheFileHeaderSize + 4 * (n + i), static_cast<uint32_t>(kv.position(i)));
  }
  std::memcpy(p + meta_off, meta_text.data(), meta_text.size());
  uint8_t* out = p + payload_off;
  const size_t count = n * kv_dim;
  std::vector<float> row(dtype == KvDtype::f16 ? 0 : count);
  // The format is little-endian, like the host: f16 rows are copied as they are in memory.
  for (int l = 0; l < kv.n_layers(); ++l)
    for (bool is_k : {true, false}) {
      if (dtype == KvDtype::f16) {
        std::memcpy(out, is_k ? kv.k_f16(l, 0) : kv.v_f16(l, 0), count * 2);
        out += count * 2;
        continue;
      }
      is_k ? kv.read_k(l, 0, n, row.data()) : kv.read_v(l, 0, n, row.data());
      for (size_t i = 0; i < count; ++i, out += es) {
        if (dtype == KvDtype::f32) {
          std::memcpy(out, &row[i], 4);
        } else {
          store_le<uint16_t>(out, fp32_to_bf16(row[i]));
        }
      }
    }
  store_le<uint64_t>(p + kOffBodySum, XXH3_64bits(p + kCacheFileHeaderSize, b.size() - kCacheFileHeaderSize));
  store_le<uint64_t>(p + kOffHeaderSum, header_checksum(p));
  return b;
}

size_t write_cache_file(const std::string& path, const ChunkCache& c, KvDtype dtype, bool durable,
                        const EntryAuth* auth) {
  std::vector<uint8_t> bytes = encode_cache_file(c, dtype);
  if (auth) auth->seal(bytes);
  return write_cache_bytes(path, bytes, durable);
}

size_t write_cache_bytes(const std::string& path, const std::vector<uint8_t>& bytes, bool durable) {
  try {
    return write_private_file_atomic(path, bytes.data(), bytes.size(), durable);
  } catch (const std::runtime_error& e) {
    throw CacheFileError(CacheFileDefect::io_error, path, e.what());
  }
}

ChunkCache read_cache_file(const std::string& path, const CacheFileExpect& expect) {
  MappedFile mapped(path);
  return decode_cache_file(mapped.data(), mapped.size(), path, expect);
}

ChunkCache decode_cache_file(const uint8_t* data, size_t size, const std::string& path, const CacheFileExpect& expect) {
  const Image f{data, size};
  Parsed r = parse(f, path);
  auto fail = [&](CacheFileDefect d, const std::string& detail) { throw CacheFileError(d, path, detail); };
  if (expect.model_fingerprint && r.fingerprint != *expect.model_fingerprint) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "made by model %016llx, expected %016llx", static_cast<unsigned long long>(r.fingerprint),
                  static_cast<unsigned long long>(*expect.model_fingerprint));
    fail(CacheFileDefect::foreign_model, buf);
  }
  if (expect.hparams && (expect.hparams->n_layers != r.n_layers || expect.hparams->n_kv_heads != r.n_kv_heads ||
                         expect.hparams->head_dim != r.head_dim))
    fail(CacheFileDefect::shape_mismatch,
         "layers/kv heads/head dim " + std::to_string(r.n_layers) + "/" + std::to_string(r.n_kv_heads) + "/" +
             std::to_string(r.head_dim) + ", expected " + std::to_string(expect.hparams->n_layers) + "/" +
             std::to_string(expect.hparams->n_kv_heads) + "/" + std::to_string(expect.hparams->head_dim));
  if (expect.auth &&
      (!r.has_tag || !expect.auth->verify(f.data(), r.entry_size, f.data() + r.entry_size + 8)))
    fail(CacheFileDefect::unauthenticated, r.has_tag ? "HMAC tag does not match (tampered, or another store key)"
                                                     : "no HMAC tag, and the store requires one");
  if (XXH3_64bits(f.data() + kCacheFileHeaderSize, r.entry_size - kCacheFileHeaderSize) !=
      load_le<uint64_t>(f.data() + kOffBodySum))
    fail(CacheFileDefect::checksum_mismatch, "body checksum differs");
  parse_meta(f, r, path);

  const uint8_t* p = f.data();
  std::vector<TokenId> tokens(r.n_tokens);
  for (size_t i = 0; i < r.n_tokens; ++i)
    tokens[i] = static_cast<TokenId>(load_le<uint32_t>(p + kCacheFileHeaderSize + 4 * i));
  ChunkKey key(r.fingerprint, std::move(tokens), meta_variant(r.meta, path));
  if (key.hash() != r.key) fail(CacheFileDefect::key_mismatch, "contents hash to " + key.id() + ", header says " + hash128_hex(r.key));
  if (!expect.key_id.empty() && key.id() != expect.key_id)
    fail(CacheFileDefect::key_mismatch, "holds " + key.id() + ", expected " + expect.key_id);

  ModelHparams h;
  if (expect.hparams) {
    h = *expect.hparams;
  } else {
    h.n_layers = r.n_layers;
    h.n_kv_heads = r.n_kv_heads;
    h.head_dim = r.head_dim;
    h.rope_dims = r.head_dim;
  }
  KvCache kv(h, r.n_tokens);
  kv.append(r.n_tokens);
  for (size_t i = 0; i < r.n_tokens; ++i)
    kv.set_position(i, static_cast<int32_t>(load_le<uint32_t>(p + kCacheFileHeaderSize + 4 * (r.n_tokens + i))));
  const uint8_t* in = p + r.payload_off;
  const size_t count = r.n_tokens * static_cast<size_t>(kv.kv_dim()), es = dtype_size(r.dtype);
  std::vector<float> row(r.dtype == KvDtype::f16 ? 0 : count);
  // The format is little-endian, like the host: f16 is the cache's own storage, a copy;
  // f32 and bf16 are converted and rounded to f16 (exact for files the engine wrote, whose
  // values came from an f16 cache; bf16 ones lose only outside f16's normal range).
  for (int l = 0; l < r.n_layers; ++l)
    for (bool is_k : {true, false}) {
      if (r.dtype == KvDtype::f16) {
        std::memcpy(is_k ? kv.k_f16(l, 0) : kv.v_f16(l, 0), in, count * 2);
      } else {
        if (r.dtype == KvDtype::f32)
          std::memcpy(row.data(), in, count * 4);
        else
          for (size_t i = 0; i < count; ++i) row[i] = bf16_to_fp32(load_le<uint16_t>(in + 2 * i));
        is_k ? kv.write_k(l, 0, r.n_tokens, row.data()) : kv.write_v(l, 0, r.n_tokens, row.data());
      }
      in += count * es;
    }

  ChunkCache c(std::move(key), std::move(kv));
  const auto& m = r.meta;
  try {
    c.offline_ms = m.value("offline_ms", 0.0);
    c.created_unix_ms = m.value("created_unix_ms", int64_t{0});
    if (m.contains("extra")) c.extra = m.at("extra");
  } catch (const std::exception& e) {
    fail(CacheFileDefect::bad_metadata, e.what());
  }
  return c;
}

CacheFileInfo read_cache_file_info(const std::string& path) {
  MappedFile mapped(path);
  const Image f{mapped.data(), mapped.size()};
  Parsed r = parse(f, path);
  parse_meta(f, r, path);
  CacheFileInfo info;
  info.path = path;
  info.key_id = hash128_hex(r.key);
  info.model_fingerprint = r.fingerprint;
  info.dtype = r.dtype;
  info.n_layers = r.n_layers;
  info.n_kv_heads = r.n_kv_heads;
  info.head_dim = r.head_dim;
  info.n_tokens = r.n_tokens;
  info.file_bytes = f.size();
  info.kind = meta_variant(r.meta, path).kind;
  try {
    info.offline_ms = r.meta.value("offline_ms", 0.0);
    info.created_unix_ms = r.meta.value("created_unix_ms", int64_t{0});
    if (auto e = r.meta.find("extra"); e != r.meta.end() && e->is_object()) info.extra = *e;
  } catch (const std::exception& e) {
    throw CacheFileError(CacheFileDefect::bad_metadata, path, e.what());
  }
  return info;
}

}  // namespace cf

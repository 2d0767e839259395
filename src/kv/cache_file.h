// The on-disk format of one chunk cache (<id>.cfkv). All integers little-endian.
//
//   offset size  field
//   0      8     magic "CFKVCACH"
//   8      4     u32 format version (kCacheFileVersion)
//   12     4     u32 header size (128)
//   16     8     u64 model fingerprint
//   24     4     u32 dtype of the payload (0 f32, 1 f16, 2 bf16)
//   28     4     u32 n_layers
//   32     4     u32 n_kv_heads
//   36     4     u32 head_dim
//   40     8     u64 n_tokens
//   48     16    key id (binary form of the 32 hex digits)
//   64     8     u64 metadata JSON length
//   72     8     u64 payload length (= 2 * n_layers * n_tokens * n_kv_heads * head_dim * dtype size)
//   80     8     u64 body checksum: XXH3-64 (seed 0) of every byte after the header
//   88     8     u64 header checksum: XXH3-64 of bytes [0, 128) with this field zeroed
//   96     32    reserved, zero
//   128          i32 tokens[n_tokens]
//                i32 positions[n_tokens]
//                metadata JSON (UTF-8): {"key_id", "variant": {"kind", "context_hash"},
//                  "offline_ms", "created_unix_ms", "extra"}
//                zero padding up to the next multiple of 64 from the file start
//   payload      for each layer: K [n_tokens][kv_dim], then V [n_tokens][kv_dim], in dtype
//   end of file  (exactly; trailing bytes are an error)
//
// Files are written atomically (temp file in the same directory, fsync, rename, fsync of
// the directory), so a reader sees either no file or a complete one. Reading maps the file
// read-only and validates every field before converting the payload to float.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kv/chunk_cache.h"

namespace cf {

class EntryAuth;

inline constexpr uint32_t kCacheFileVersion = 1;
inline constexpr uint32_t kCacheFileHeaderSize = 128;

enum class KvDtype : uint32_t { f32 = 0, f16 = 1, bf16 = 2 };
const char* dtype_name(KvDtype d);
bool parse_dtype(std::string_view s, KvDtype& out);  // "f32" | "f16" | "bf16"
size_t dtype_size(KvDtype d);

// Rounds every K/V value through `d` and back (what a file of that dtype would return).
void round_to_dtype(KvCache& kv, KvDtype d);
uint16_t fp32_to_bf16(float f);  // round to nearest even; NaN stays NaN

enum class CacheFileDefect {
  not_found,          // no such file (a plain miss, not a defect of the store)
  io_error,           // open/read/mmap/write failed
  truncated,          // shorter than the header or than its header says
  size_mismatch,      // longer than its header says
  bad_magic,
  wrong_version,      // a format version (or header size) this build does not read
  bad_header,         // impossible header fields (unknown dtype, payload length not matching the dims)
  checksum_mismatch,  // header or body checksum differs
  foreign_model,      // computed by another model (fingerprint differs)
  shape_mismatch,     // dims differ from the expected model's
  bad_metadata,       // metadata JSON unreadable or missing fields
  key_mismatch,       // contents do not hash to the key id in the header / the file name
  unauthenticated,    // a store key is set and the HMAC trailer is missing or wrong (entry_auth.h)
};
const char* defect_name(CacheFileDefect d);

class CacheFileError : public std::runtime_error {
 public:
  CacheFileError(CacheFileDefect reason, std::string path, const std::string& detail);
  CacheFileDefect reason() const { return reason_; }
  const std::string& path() const { return path_; }

 private:
  CacheFileDefect reason_;
  std::string path_;
};

// What a reader expects; unset fields are not checked.
struct CacheFileExpect {
  std::optional<uint64_t> model_fingerprint;
  // Checks n_layers, n_kv_heads, head_dim; the loaded KvCache carries these hparams (RoPE
  // settings included). Unset: the KvCache gets hparams made from the file's dims only.
  std::optional<ModelHparams> hparams;
  std::string key_id;  // the id the file must hold (from its name)
  const EntryAuth* auth = nullptr;  // set: the file must carry a valid HMAC trailer
};

// Header and metadata of a file, validated as far as reading them allows (magic, version,
// header checksum, sizes against the file size, metadata JSON); the body checksum is NOT
// checked. For listings.
struct CacheFileInfo {
  std::string path;
  std::string key_id;
  uint64_t model_fingerprint = 0;
  KvDtype dtype = KvDtype::f16;
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  size_t n_tokens = 0;
  size_t file_bytes = 0;
  ContextKind kind = ContextKind::pic;
  double offline_ms = 0;
  int64_t created_unix_ms = 0;
  nlohmann::json extra = nlohmann::json::object();  // the methods' metadata (ChunkCache::extra)
};

// The complete file image of `c` in `dtype`.
std::vector<uint8_t> encode_cache_file(const ChunkCache& c, KvDtype dtype);
// Writes it atomically; returns the file size. Throws CacheFileError(io_error).
// durable = false skips the fsyncs: still atomic for readers, but after a power loss the
// file may be missing or damaged (which readers detect and recompute).
size_t write_cache_file(const std::string& path, const ChunkCache& c, KvDtype dtype, bool durable = true,
                        const EntryAuth* auth = nullptr);  // auth: append its HMAC trailer
// The same atomic write for an image already encoded (or received from the remote tier).
size_t write_cache_bytes(const std::string& path, const std::vector<uint8_t>& bytes, bool durable = true);
// Maps, validates and decodes; throws CacheFileError naming the file and the defect.
ChunkCache read_cache_file(const std::string& path, const CacheFileExpect& expect = {});
// The same validation and decoding for an image in memory; `name` goes into the errors.
ChunkCache decode_cache_file(const uint8_t* data, size_t size, const std::string& name, const CacheFileExpect& expect = {});
CacheFileInfo read_cache_file_info(const std::string& path);

}  // namespace cf

#include "kv/chunk_key.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>

#include "base/enum_names.h"

namespace cf {
namespace {

// Little-endian appenders for the canonical serializations.
void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n) {
  // resize + memcpy rather than insert(range): GCC 12 warns falsely on the latter.
  const size_t at = b.size();
  b.resize(at + n);
  std::memcpy(b.data() + at, p, n);
}
void put_u8(std::vector<uint8_t>& b, uint8_t v) { b.push_back(v); }
void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_tokens(std::vector<uint8_t>& b, std::span<const TokenId> t) {
  put_u32(b, static_cast<uint32_t>(t.size()));
  for (TokenId x : t) put_u32(b, static_cast<uint32_t>(x));
}

Hash128 hash128(const std::vector<uint8_t>& bytes) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(bytes.data(), bytes.size()));
  Hash128 h;
  std::memcpy(h.data(), c.digest, h.size());
  return h;
}

}  // namespace

constexpr EnumName<ContextKind> kContextKindNames[] = {
    {ContextKind::pic, "pic"}, {ContextKind::after_prefix, "after_prefix"}, {ContextKind::neighbours, "neighbours"}};
constexpr EnumName<ChunkContext> kChunkContextNames[] = {{ChunkContext::alone, "alone"},
                                                         {ChunkContext::prefixed, "prefixed"}};

const char* context_kind_name(ContextKind k) { return enum_name(kContextKindNames, k); }

bool parse_context_kind(std::string_view s, ContextKind& out) { return parse_enum_name(kContextKindNames, s, out); }

const char* chunk_context_name(ChunkContext v) { return enum_name(kChunkContextNames, v); }

bool parse_chunk_context(std::string_view s, ChunkContext& out) { return parse_enum_name(kChunkContextNames, s, out); }

std::string hash128_hex(const Hash128& h) {
  static const char* digits = "0123456789abcdef";
  std::string s(32, '0');
  for (size_t i = 0; i < h.size(); ++i) {
    s[2 * i] = digits[h[i] >> 4];
    s[2 * i + 1] = digits[h[i] & 15];
  }
  return s;
}

bool is_chunk_id(std::string_view s) {
  Hash128 h;
  return parse_hash128_hex(s, h);
}

std::string printable_chunk_id(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 80; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 80) out += "...";
  return out;
}

bool parse_hash128_hex(std::string_view hex, Hash128& out) {
  if (hex.size() != 32) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;  // upper case is not canonical: ids are always written lower case
  };
  for (size_t i = 0; i < 16; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

KeyContext KeyContext::pic() { return {}; }

KeyContext KeyContext::after_prefix(std::span<const TokenId> prefix) {
  std::vector<uint8_t> b;
  put_bytes(b, "CFPREFX1", 8);
  put_tokens(b, prefix);
  return {ContextKind::after_prefix, hash128(b)};
}

KeyContext KeyContext::neighbours(std::span<const TokenId> prefix, std::span<const ChunkKey> neighbours) {
  std::vector<uint8_t> b;
  put_bytes(b, "CFNEIGH1", 8);
  put_tokens(b, prefix);
  put_u32(b, static_cast<uint32_t>(neighbours.size()));
  for (const ChunkKey& k : neighbours) put_bytes(b, k.hash().data(), k.hash().size());
  return {ContextKind::neighbours, hash128(b)};
}

std::vector<uint8_t> chunk_key_bytes(uint64_t model_fingerprint, std::span<const TokenId> tokens,
                                     const KeyContext& context) {
  std::vector<uint8_t> b;
  b.reserve(8 + 8 + 1 + 16 + 4 + 4 * tokens.size());
  put_bytes(b, "CFCHUNK1", 8);
  put_u64(b, model_fingerprint);
  put_u8(b, static_cast<uint8_t>(context.kind));
  put_bytes(b, context.context_hash.data(), context.context_hash.size());
  put_tokens(b, tokens);
  return b;
}

ChunkKey::ChunkKey(uint64_t model_fingerprint, std::vector<TokenId> tokens, KeyContext context)
    : fingerprint_(model_fingerprint), tokens_(std::move(tokens)), context_(context) {
  hash_ = hash128(chunk_key_bytes(fingerprint_, tokens_, context_));
  id_ = hash128_hex(hash_);
}

ChunkKey base_chunk_key(uint64_t model_fingerprint, std::vector<TokenId> tokens, ChunkContext v,
                        std::span<const TokenId> system) {
  return ChunkKey(model_fingerprint, std::move(tokens),
                  v == ChunkContext::prefixed ? KeyContext::after_prefix(system) : KeyContext::pic());
}

}  // namespace cf

// Content address of a chunk cache: which model computed it, over which tokens, in which
// context. Two caches with the same key hold the same K/V (up to float rounding of the
// machine that computed them), so the key is all a store needs to find or share one.
//
// Names (issue 25: "variant" used to mean four things):
//   KeyContext (ContextKind + context hash): what a stored cache was computed after, part of
//     its key: pic, after_prefix(P), neighbours(S, n1..nk).
//   ChunkContext (alone | prefixed): which base cache a request uses for its chunks (serve
//     --chunk-context, fusion.chunk_context, bench --chunk-contexts); alone is the key context
//     pic, prefixed is after_prefix(S) (base_chunk_key).
//   Cache-Craft's variants (§3.3, "chunk-cache variants"): the several after_prefix caches
//     of one chunk it keeps and chooses among (select_cachecraft.h).
//   Method presets (bench --method-presets): named option sets of a method, eval/runner.h.
//
// Key id = XXH3-128 over this canonical byte string (all integers little-endian):
//   "CFCHUNK1"                      8 bytes, domain tag; bump the digit if this layout changes
//   u64  model fingerprint          Model::fingerprint(): hash of the whole GGUF file
//   u8   context kind               0 = pic, 1 = after_prefix, 2 = neighbours
//   u8[16] context hash             canonical (big-endian) XXH3-128, all zero for pic
//   u32  n_tokens
//   i32  tokens[n_tokens]
// written as 32 lower-case hex digits of the canonical (big-endian) XXH128 form.
//
// The context hash of each kind:
//   pic:          none (all zero). The chunk computed alone from position 0 (TurboRAG/EPIC's
//                 position-independent cache).
//   after_prefix: XXH3-128 of "CFPREFX1" u32 n i32 prefix[n]. The chunk computed after the
//                 prefix tokens (prefix at 0..n-1, chunk at n..): FusionRAG eq. 5 (S as prefix),
//                 one of Cache-Craft's variants.
//   neighbours:   XXH3-128 of "CFNEIGH1" u32 n_prefix i32 prefix[n_prefix] u32 n_neighbours
//                 u8[16] neighbour_id[n_neighbours] (each neighbour's own key id, in order).
//                 FusionRAG eq. 10: the chunk computed after S and its top-n neighbours.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

namespace cf {

enum class ContextKind : uint8_t { pic = 0, after_prefix = 1, neighbours = 2 };
const char* context_kind_name(ContextKind k);                  // "pic", "after_prefix", "neighbours"
bool parse_context_kind(std::string_view s, ContextKind& out);  // false on an unknown name

using Hash128 = std::array<uint8_t, 16>;  // canonical (big-endian) XXH3-128
std::string hash128_hex(const Hash128& h);
bool parse_hash128_hex(std::string_view hex, Hash128& out);  // false unless 32 hex digits
// Whether `s` has the form of a key id: exactly 32 lower-case hex digits. Ids from outside
// (HTTP paths, the CLI) are checked with this before they name anything (issue 29 item 8).
bool is_chunk_id(std::string_view s);
// An untrusted id for a message: printable ASCII kept, other bytes (and \ ") as \xNN, at most
// 80 bytes shown, so any bytes can be named in an error, a log line or a JSON body.
std::string printable_chunk_id(std::string_view s);

class ChunkKey;

struct KeyContext {
  ContextKind kind = ContextKind::pic;
  Hash128 context_hash{};  // see the header comment; zero for pic

  static KeyContext pic();
  static KeyContext after_prefix(std::span<const TokenId> prefix);
  static KeyContext neighbours(std::span<const TokenId> prefix, std::span<const ChunkKey> neighbours);
  bool operator==(const KeyContext&) const = default;
};

class ChunkKey {
 public:
  ChunkKey(uint64_t model_fingerprint, std::vector<TokenId> tokens, KeyContext context = KeyContext::pic());

  uint64_t model_fingerprint() const { return fingerprint_; }
  const std::vector<TokenId>& tokens() const { return tokens_; }
  const KeyContext& context() const { return context_; }
  const Hash128& hash() const { return hash_; }
  const std::string& id() const { return id_; }  // 32 hex digits

  bool operator==(const ChunkKey& o) const { return hash_ == o.hash_; }

 private:
  uint64_t fingerprint_;
  std::vector<TokenId> tokens_;
  KeyContext context_;
  Hash128 hash_;
  std::string id_;
};

// Which base cache stands for a retrieved chunk (issue 14; the two the papers compare):
//   alone:    the chunk computed alone from position 0 (key context pic; TurboRAG/EPIC's
//             position-independent cache). Its first row is computed with no context at all
//             and acts as an extra attention sink once stitched.
//   prefixed: the chunk computed after the request's system prefix S (key context
//             after_prefix(S), FusionRAG eq. 5 / its Full-Reuse baseline); S's rows are not
//             stored. The chunk's rows sit at |S|..|S|+n-1 and are moved like any other.
// The two are keyed apart (kind and, for prefixed, the hash of S are in the key id).
enum class ChunkContext : uint8_t { alone = 0, prefixed = 1 };
const char* chunk_context_name(ChunkContext v);                  // "alone", "prefixed"
bool parse_chunk_context(std::string_view s, ChunkContext& out);  // false on an unknown name
// The key of a chunk's base cache for a request whose system prefix is `system`.
ChunkKey base_chunk_key(uint64_t model_fingerprint, std::vector<TokenId> tokens, ChunkContext v,
                        std::span<const TokenId> system);
// The prefix that base cache is computed after: empty for alone, `system` for prefixed.
inline std::span<const TokenId> base_chunk_prefix(ChunkContext v, std::span<const TokenId> system) {
  return v == ChunkContext::prefixed ? system : std::span<const TokenId>();
}

// The exact bytes the key id hashes (exposed so tests can pin the layout down).
std::vector<uint8_t> chunk_key_bytes(uint64_t model_fingerprint, std::span<const TokenId> tokens,
                                     const KeyContext& context);

}  // namespace cf

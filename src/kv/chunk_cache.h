// A chunk cache: the K/V of one chunk's tokens in every layer, computed once (offline) and
// reused by requests that retrieve the chunk. Keys are stored after RoPE at the positions
// they were computed at (0..n-1 for PIC, after the prefix for after_prefix); a user moves
// them to where the chunk sits in its request with KvCache::append_from(kv, 0, n, delta).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>

#include "kv/chunk_key.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"

namespace cf {

struct ChunkCache {
  ChunkCache(ChunkKey key, KvCache kv) : key(std::move(key)), kv(std::move(kv)) {}

  ChunkKey key;      // tokens and variant live here
  KvCache kv;        // exactly key.tokens().size() entries, in token order
  double offline_ms = 0;       // time the forward pass(es) took to compute it
  int64_t created_unix_ms = 0; // wall clock when it was computed
  // Open-ended metadata for the layers above (anchors, per-variant attention scores...).
  // Stored in the file's metadata JSON, so it must stay JSON-serializable.
  nlohmann::json extra = nlohmann::json::object();

  size_t n_tokens() const { return kv.size(); }
  const std::vector<TokenId>& tokens() const { return key.tokens(); }
  // Bytes this cache holds in memory (K/V floats, tokens, positions, metadata estimate):
  // what the memory tier charges against its budget.
  size_t memory_bytes() const;
};

int64_t unix_time_ms();

// Computes the cache of key.tokens() with `fwd` and times it.
//  - pic: the chunk alone at positions 0..n-1; `prefix` must be empty.
//  - after_prefix: runs `prefix` at 0..p-1, then the chunk at p..p+n-1, and keeps only the
//    chunk's entries; `prefix` must hash to key.context() (else std::invalid_argument).
//  - neighbours: not computed here (the context is made of other chunk caches): use
//    compute_chunk_cache_in_context. std::invalid_argument.
// Throws std::invalid_argument too if the key's fingerprint is not fwd's model's.
ChunkCache compute_chunk_cache(Forward& fwd, const ChunkKey& key, std::span<const TokenId> prefix = {});

// Runs the chunk after whatever `context` already holds (e.g. S plus the neighbours'
// caches moved into place), at positions start_pos..start_pos+n-1, keeps the chunk's
// entries, and truncates `context` back to its former size. The caller vouches that the
// context is the one key.context() names. offline_ms covers this pass only.
ChunkCache compute_chunk_cache_in_context(Forward& fwd, const ChunkKey& key, KvCache& context, int32_t start_pos);

}  // namespace cf

// Exact prefix caching for serving (issue 5, item 3): a radix tree over blocks of token ids
// whose nodes hold the K/V of their block, computed in the context of the whole path from
// the root (so a node's K/V is only valid after exactly that prefix). Shared by all
// requests: system prompts, conversation history and, with CRAFT, prefixes of reordered
// chunks. Only exact K/V goes in (a full prefill of those tokens): fused, approximate caches
// never do.
//
// Eviction: when the bytes held exceed the budget, the least recently used leaf is dropped,
// repeatedly (a parent becomes a leaf in turn; a path is touched as a whole, so a parent is
// never older than its children). A block's K/V is immutable and shared: a lookup takes
// references under the lock and copies outside it, so a block evicted meanwhile is freed
// only when that copy ends (stats.bytes counts what the tree holds).
// Under a shared K/V budget (options.account, serve/kv_budget.h) each block is charged before it
// is linked in; a charge refused evicts the least recently used leaf not on the path being
// inserted and is tried again, and with none left the insert stops there (the blocks before it
// stay). release(n) is the budget's give-back: LRU leaves dropped until n bytes are freed.
// Thread-safe: one mutex around the tree; several lookups and inserts may run at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "fusion/executor.h"
#include "kv/kv_account.h"
#include "runtime/kv_cache.h"

namespace cf {

struct PrefixCacheOptions {
  size_t block_tokens = 16;                     // granularity of sharing (vLLM APC uses 16)
  size_t budget_bytes = size_t{256} << 20;      // K/V bytes held at most
  KvAccount* account = nullptr;                 // the shared K/V budget's (outlives the cache); null: none
};

struct PrefixCacheStats {
  uint64_t lookups = 0, hits = 0;               // hit: at least one block matched
  uint64_t lookup_tokens = 0, hit_tokens = 0;   // tokens asked for / served from the cache
  uint64_t inserted_blocks = 0, evicted_blocks = 0;
  size_t blocks = 0, bytes = 0, budget_bytes = 0;
};

class PrefixCache : public PrefixSource {
 public:
  PrefixCache(const ModelHparams& h, PrefixCacheOptions opt = {});
  ~PrefixCache() override;

  // Longest cached prefix of `tokens` in whole blocks: appends its K/V (positions 0..n-1) to
  // `out`, which must be empty, and returns n (a multiple of block_tokens, possibly 0).
  size_t lookup(std::span<const TokenId> tokens, KvCache& out);
  // Stores the whole blocks of tokens[0..n) whose exact K/V sits in cache slots 0..n-1
  // (positions 0..n-1); blocks already present are shared, not copied again.
  void insert(std::span<const TokenId> tokens, const KvCache& cache);

  // PrefixSource: lookup, prefill the rest with `fwd` (exact), insert, return the cache.
  std::shared_ptr<const KvCache> prefix(Forward& fwd, std::span<const TokenId> tokens,
                                        size_t& hit_tokens) override;

  PrefixCacheStats stats() const;
  void clear();
  // Drops least recently used leaves until `bytes` are freed or the tree is empty; returns the
  // bytes freed (KvBudget's give-back).
  size_t release(size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cf

// The fused prefill (docs/ARCHITECTURE.md "The request"): lay out S + chunks + U at consecutive
// positions, take S from an exact prefix cache and each chunk's K/V from the chunk store
// (moving keys to their request positions), let a selector choose the context rows P to
// recompute, then run the forward pass over P (into their own slots) and all of U (new
// slots) layer by layer, so a recomputed row sees the fresh K/V of the others (QCFuse
// Eq. 7). Returns the first token's logits and a cache that decoding continues from.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "fusion/fusion_options.h"
#include "fusion/selector.h"
#include "kv/chunk_store.h"

namespace cf {

// Where S (the exact prefix before the chunks) comes from. The default is an exact-match
// map inside the executor; the server plugs in its radix prefix cache (serve/prefix_cache.h).
class PrefixSource {
 public:
  virtual ~PrefixSource() = default;
  // A cache holding exactly the K/V of `tokens` at positions 0..n-1 (computing what it
  // lacks with `fwd`); hit_tokens = how many of them were already cached.
  virtual std::shared_ptr<const KvCache> prefix(Forward& fwd, std::span<const TokenId> tokens, size_t& hit_tokens) = 0;
};

// Completes `kv`, which holds the exact K/V of tokens[0, kv.size()) at positions 0.., with
// the rest of `tokens` by a plain prefill at positions kv.size().. (how a PrefixSource fills
// what it lacks).
void extend_prefix(Forward& fwd, KvCache& kv, std::span<const TokenId> tokens);

struct FusionTimings {
  double lookup_ms = 0;     // prefix cache and chunk store lookups (incl. disk loads)
  double load_ms = 0;       // stitching: copying caches in, moving keys to their positions
  double selection_ms = 0;  // the selector (probes, scoring)
  double recompute_ms = 0;  // forward pass over P and U
  double ttft_ms = 0;       // request tokens known -> first-token logits
  double offline_ms = 0;    // chunk caches computed during this request (missing from the store)
};

// A chunk cache a prefill needed and did not compute: its key and the tokens it is computed
// after (base_chunk_prefix: none for alone, S for prefixed).
struct ChunkFill {
  ChunkKey key;
  std::vector<TokenId> prefix;
};

// What the auto policy makes of chunk caches the store lacks (auto_quality.h, issue 60 item 2).
//  offline: a prefill computes them and times them apart (FusionTimings::offline_ms), as every
//           fixed method does: the bench and `ask` measure TTFT over warm caches.
//  priced:  they are part of the request's cost, as in the server, whose TTFT is the client's
//           wait: the policy prices them, and the caches it did not compute come back in
//           FusionResult::chunks_to_fill for the caller to compute off the request's path.
enum class ColdChunks { offline, priced };

struct FusionResult {
  std::vector<float> logits;      // first output token
  KvCache cache;                  // S c1..cm U, ready for decoding
  int32_t next_position = 0;
  std::vector<size_t> recomputed; // context slots recomputed (ascending)
  size_t context_tokens = 0;
  size_t chunk_hits = 0, chunk_misses = 0;
  std::vector<bool> chunk_hit;     // per chunk: its cache came from the store (false: computed now); empty: none looked up
  bool prefix_hit = false;         // S came (at least partly) from the prefix cache
  size_t prefix_hit_tokens = 0;
  FusionTimings timings;
  nlohmann::json selection_details;
  std::vector<double> token_scores;  // Selection::scores (per context token; empty: none)
  std::string score_kind;            // Selection::score_kind
  nlohmann::json auto_decision;      // method "auto": what the policy chose (AutoDecision::to_json); else null
  std::vector<ChunkFill> chunks_to_fill;  // ColdChunks::priced: caches left cold (fill() computes them)
};

namespace autoq {
struct AutoCalibration;
}

class FusionExecutor {
 public:
  // `prefixes` (optional, not owned) replaces the built-in exact-match map for S. With one,
  // full prefill also takes S from it (and prefills chunks and U after it); without, full prefill is
  // one plain prefill of the whole request, the reference every benchmark compares with.
  FusionExecutor(Forward& fwd, ChunkStore& store, PrefixSource* prefixes = nullptr,
                 ColdChunks cold = ColdChunks::offline);
  // Throws std::invalid_argument on an unknown method or a ratio outside [0, 1].
  FusionResult prefill(const RagRequest& request, const FusionOptions& opt);

  // ColdChunks::priced: the base caches of `request` (chunk_keys) that no tier holds, which a
  // fused prefill would compute on the request's path (a cache on disk or in the remote tier
  // counts as held: its load, prefetched while the request waits, is small against computing
  // it). Empty under ColdChunks::offline and for full prefill.
  std::vector<ChunkFill> missing_chunks(const RagRequest& request, const FusionOptions& opt) const;
  // Computes and stores caches a prefill handed back (get_or_compute: one stored since is kept).
  // The one place a missing chunk cache is computed, inside a prefill or after it.
  void fill(std::span<const ChunkFill> chunks);

  // The store key prefill() looks chunk i of `request` up by (its base cache: PIC or prefixed,
  // kv/chunk_key.h), and all of them in chunk order (none for full prefill, which looks none up).
  // The one place these keys are made: whoever prefetches uses them (issue 25 item 2).
  static ChunkKey chunk_key(uint64_t model_fingerprint, const RagRequest& request, const FusionOptions& opt, size_t i);
  static std::vector<ChunkKey> chunk_keys(uint64_t model_fingerprint, const RagRequest& request,
                                          const FusionOptions& opt);
  // Queues the loads of chunk_keys() (ChunkStore::prefetch, Cache-Craft §3.5) for a request
  // that waits before its prefill; returns at once.
  static void prefetch(ChunkStore& store, uint64_t model_fingerprint, const RagRequest& request,
                       const FusionOptions& opt);

  // Method "auto" answers with this calibration (not owned) instead of the model's shared one:
  // the server's, recalibrated by its self-check (serve/self_check.h). nullptr: the shared one.
  void set_calibration(const autoq::AutoCalibration* cal) { calibration_ = cal; }

 private:
  std::shared_ptr<const KvCache> prefix_cache(const std::vector<TokenId>& system, size_t& hit_tokens);
  FusionResult prefill_auto(const RagRequest& request, const FusionOptions& opt);
  std::shared_ptr<const ChunkCache> compute_missing(const ChunkFill& chunk);  // get_or_compute
  Forward& fwd_;
  ChunkStore& store_;
  PrefixSource* external_prefixes_ = nullptr;
  ColdChunks cold_ = ColdChunks::offline;
  const autoq::AutoCalibration* calibration_ = nullptr;
  std::mutex prefix_mu_;
  std::map<std::vector<TokenId>, std::shared_ptr<const KvCache>> prefixes_;  // exact match
};

}  // namespace cf

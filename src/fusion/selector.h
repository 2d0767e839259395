// Selectors choose which retrieved-context tokens a fused prefill recomputes. Each method of
// the papers is one file (select_<name>.cpp) behind this interface, citing the section it
// implements and listing its deviations. All of them see the same stitched cache and run
// their probes through the one forward pass (runtime/forward.h).
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fusion/rag_prompt.h"
#include "kv/chunk_cache.h"
#include "runtime/forward.h"

namespace cf {

// Where one retrieved chunk sits in the stitched cache (slots == request positions).
struct ChunkPlacement {
  size_t begin = 0;
  size_t n_tokens = 0;
  std::shared_ptr<const ChunkCache> cache;  // its stored cache (metadata: anchors, ...)
};

// What a selector sees. The cache holds S then every chunk's stored K/V moved to its
// request positions; entry s is at position s. The question suffix U is not in it.
struct FusionInputs {
  const RagRequest& request;
  KvCache& cache;
  std::vector<ChunkPlacement> chunks;
  size_t context_begin = 0, context_end = 0;  // slots of the retrieved context
  std::vector<TokenId> tokens;                 // the flattened request S c1..cm U
  double ratio = 0;
  uint64_t seed = 0;
  ChunkContext chunk_context = ChunkContext::alone;  // which base caches the chunks came from

  size_t context_tokens() const { return context_end - context_begin; }
  std::span<const TokenId> suffix_tokens() const {
    return std::span<const TokenId>(tokens).subspan(context_end);
  }
  int32_t suffix_position(size_t i) const { return static_cast<int32_t>(context_end + i); }
};

struct Selection {
  std::vector<size_t> slots;  // context slots to recompute, ascending
  nlohmann::json details;     // method-specific facts for reports (layers, budgets, ...)
  // The method's own score of each context token (index i = slot context_begin + i), higher =
  // more worth recomputing; what the web page highlights as "query-relevant" (issue 12).
  // Empty: the method scores nothing (random, reuse). A score-ranked method's slots are the
  // top floor(rho N) of these; a per-chunk method's (EPIC, Cache-Craft) the top of each chunk.
  std::vector<double> scores;
  std::string score_kind;     // what the score is, one line for people
};

// One option a method accepts in FusionOptions::method_options (the API's fusion.options), as
// the method describes it: listed by GET /v1/methods, read by the web page.
struct MethodParam {
  std::string name;
  std::string type;                  // "number", "integer", "boolean", "string" or "layers"
  nlohmann::json default_value;      // what the method uses when the option is absent
  std::vector<std::string> values;   // type "string": the accepted values
  std::string help;                  // one line for people

  nlohmann::json to_json() const;
};

class ChunkStore;

class Selector {
 public:
  virtual ~Selector() = default;
  virtual std::string_view name() const = 0;
  // Which stored cache stands for a chunk in this request (FusionRAG: its
  // neighbour-enriched variant; Cache-Craft: the best of its variants). `pic_key` is the
  // request's base cache key (alone: PIC; prefixed: after S). nullptr: that base cache, the
  // default. Its time counts as lookup.
  virtual std::shared_ptr<const ChunkCache> lookup_chunk(Forward& fwd, ChunkStore& store, const ChunkKey& pic_key,
                                                         const RagRequest& request, size_t chunk_index) {
    return nullptr;
  }
  // Offline per-chunk work of the method (QCFuse anchors, ...), kept in ChunkCache::extra:
  // when needs_preparation() says the chunk lacks it, the executor copies the cache, calls
  // prepare_chunk() on the copy, stores it again and counts the time as offline.
  virtual bool needs_preparation(const ChunkCache& chunk) const { return false; }
  virtual void prepare_chunk(Forward& fwd, ChunkCache& chunk) {}
  // May run probes through `fwd`, and may change the cache (CacheBlend refreshes its
  // early layers; that is part of its method and its cost) but must leave S, the context
  // and nothing else in it: probe entries are removed before returning.
  virtual Selection select(Forward& fwd, FusionInputs& in) = 0;
  // Method options from FusionOptions::method_options, before any other call (invalid_argument
  // on a key the method does not know). Default: the method has none.
  virtual void configure(const nlohmann::json& options) {
    if (!options.is_null() && !options.empty())
      throw std::invalid_argument("method " + std::string(name()) + " takes no options");
  }
  // The options configure() accepts, with their defaults (test_fusion checks that every default
  // and every listed value configures). Default: none.
  virtual std::vector<MethodParam> parameters() const { return {}; }
  // Hooks for the recompute pass itself, whose rows are the chosen slots (in the order of
  // `recompute_slots`) followed by the question suffix U. Return false for none (default).
  // Cache-Craft uses them to stop recomputing unfocused chunks after a layer (Alg. 1).
  virtual bool recompute_hooks(const FusionInputs& in, const std::vector<size_t>& recompute_slots, ForwardHooks& hooks) {
    return false;
  }
  // After that pass: what the hooks found, added to the selection's details.
  virtual void after_recompute(nlohmann::json& details) {}
  // Offline work the selector did during this request's lookups (Cache-Craft builds new
  // variants): the executor counts it as offline, not as lookup or TTFT.
  virtual double offline_ms() const { return 0; }
};

// floor(ratio * n), the papers' budget (QCFuse Eq. 11 / FusionRAG top-k): ratio in [0, 1].
size_t recompute_budget(double ratio, size_t n);

}  // namespace cf

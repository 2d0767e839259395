// Cache-Craft (cache-craft-paper.txt §3.2-3.4; digest part B): chunk-cache variants with
// attention metadata, the variant of lowest CCI·(1-β') per chunk, CFO = α·CCI·(1-β') as the
// share of each chunk to recompute, tokens ranked by the attention they paid to the old prefix.
// The selector lives in select_cachecraft.cpp; this header exposes its options, the
// offline variant builder and the metadata layout so tests and tools can use them.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fusion/cachecraft_metrics.h"
#include "fusion/selector.h"
#include "kv/chunk_store.h"

namespace cf {

struct CacheCraftOptions {
  // α of Eq. 12. Not given by the paper (tuned offline, Eq. 13). CCI >= 0.5 (digest B6.4), so
  // a cache with no prefix overlap recomputes at least α/2 of its tokens: 0.5 puts a PIC
  // chunk at 25%, inside the paper's reported 20-40% recompute range.
  double alpha = 0.5;
  // false: the request's ratio is the global budget floor(ρN), split over chunks in
  // proportion to CFO (ρ fixes α). true: Cache-Craft picks its own budget, ceil(CFO_i·|C_i|)
  // per chunk, and ρ only caps the total (ρ = 1: no cap).
  bool own_budget = false;
  // M: variants per chunk besides its PIC cache (paper's evaluation: M = 5); a request may
  // ask for at most kMaxVariantsCeiling (each variant is one more cache file per chunk).
  size_t max_variants = 5;
  static constexpr size_t kMaxVariantsCeiling = 16;
  // Store the cache of every chunk after its prefix in this request as a new variant (for
  // later requests; never used by the request that made it). Cost counted as offline.
  bool create_variants = true;
  // Focused-chunk early stop (Alg. 1, §3.4.1): after the layer L* where the set of focused
  // chunks (largest gap in the question's cumulative attention) has stayed the same for
  // `focus_window` layers, rows of unfocused chunks stop being recomputed. Off by default
  // (it changes answers; the paper gives no w); never at ρ = 1, which must equal full prefill.
  bool focus_early_stop = false;
  int focus_window = 3;  // w of Alg. 1 (not given by the paper)

  static CacheCraftOptions from_json(const nlohmann::json& j);  // unknown keys: invalid_argument
};

// The metadata a cache carries in extra["cachecraft"]["stats"]: what Eqs. 6-11 and 14 need.
struct VariantStats {
  std::vector<cachecraft::PrefixSegment> prefix;  // old prefix chunks (S excluded), in order
  std::string system_id;                          // content id of the S it was computed after ("" for PIC)
  double intra = 0;                               // head/layer-mean intra(C), strict k < q
  double a_bar = 0, b_bar = 0, cci = 0.5;
  std::vector<uint32_t> rank;                     // token indices, most prefix-attending first

  nlohmann::json to_json() const;
  static VariantStats from_json(const nlohmann::json& j);
};

// Content id of a token sequence (its PIC key id): how prefixes name their chunks.
std::string segment_id(uint64_t model_fingerprint, const std::vector<TokenId>& tokens);

// Statistics of a PIC cache (chunk alone at 0..n-1): one forward pass with attention
// capture. No old prefix, so tokens are ranked by the attention they pay to the chunk's
// first token, the attention sink that stands in for the missing prefix (our choice; the
// paper has no PIC variant).
VariantStats pic_stats(Forward& fwd, const std::vector<TokenId>& chunk);

struct VariantBuildReport {
  size_t created = 0;
  size_t skipped_existing = 0, skipped_full = 0;
  double forward_ms = 0;  // the one pass over the request, attention capture included
  double total_ms = 0;    // plus metadata, stats of new PIC caches and store writes
};

// The offline step: one forward pass over S c1..cm with attention capture; each chunk's
// K/V after its true prefix becomes an after_prefix variant (key: S c1..c(i-1)) with its
// stats, and its PIC cache's index (extra["cachecraft"]["variants"]) lists it. Chunks that
// already have this variant, or M of them, are skipped; missing PIC caches are computed.
VariantBuildReport build_cachecraft_variants(Forward& fwd, ChunkStore& store, const RagRequest& request,
                                             const CacheCraftOptions& opt = {});

std::unique_ptr<Selector> make_cachecraft_selector(const CacheCraftOptions& opt);

// How many variants a chunk's metadata (its PIC cache's ChunkCache::extra) indexes (the web
// app's cache state).
size_t cachecraft_variant_count(const nlohmann::json& extra);

}  // namespace cf

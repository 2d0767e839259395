// Layer-wise KV deviation (issue 14, item 3): how far the K/V a fused prefill leaves in the
// request's cache are from full prefill's, layer by layer, as the relative L2 (Frobenius)
// distance ||X - X_full|| / ||X_full|| over a range of slots, for X = K and X = V.
// FusionRAG's eq. 7 sums squared differences per token; its "70% lower at layer 2" is a
// ratio of such sums between two methods, which the relative distance preserves (up to the
// square root) while staying comparable across layers of different scale.
//
// `chunkfuse deviation` runs it over a dataset: per example, full prefill once, then every
// method x ratio x chunk context (reuse and the enriched caches, i.e. fusionrag at ratio 0,
// included) through the same FusionExecutor the bench uses, and writes one CSV row per
// (example, variant, method, ratio, part, layer), part = "context" (the retrieved chunks'
// slots) or "question" (U's slots: what the first token is computed from).
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/datasets.h"
#include "fusion/rag_prompt.h"
#include "kv/chunk_key.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"

namespace cf::eval {

struct LayerDeviation {
  int layer = 0;
  double k_rel = 0, v_rel = 0;  // ||X - X_ref|| / ||X_ref|| over the slots (0 if both are 0)
};

// Slots [begin, end) of `other` against the same slots of `reference`, every layer. Both
// caches must hold the same request laid out the same way (slot s = position s).
// std::invalid_argument on a shape mismatch or a range outside either cache.
std::vector<LayerDeviation> kv_deviation(const KvCache& reference, const KvCache& other, size_t begin, size_t end);

struct DeviationConfig {
  std::vector<std::string> methods = {"reuse", "fusionrag", "epic", "cacheblend", "prophet", "qcfuse", "cachecraft"};
  std::vector<double> ratios = {0, 0.15};  // reuse runs at 0 only; fusionrag at 0 = its enriched caches
  std::vector<ChunkContext> chunk_contexts = {ChunkContext::alone, ChunkContext::prefixed};
  size_t limit = 4;                        // first N examples
  std::string out_dir;                     // deviation.csv
  std::string store_dir;                   // empty: memory-only store
  size_t memory_budget_bytes = size_t{1536} << 20;
  RagPromptOptions prompt;
  nlohmann::json method_options = nlohmann::json::object();  // {"method": {...}}
  bool progress = true;
};

// Writes <out_dir>/deviation.csv (header: dataset,example,chunk_context,method,ratio,part,
// layer,k_rel,v_rel); returns its path. Examples too long for the context are skipped.
std::string run_deviation(Forward& fwd, const Dataset& dataset, const DeviationConfig& cfg);

}  // namespace cf::eval

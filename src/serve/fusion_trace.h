// What one completion's prefill did, for the web page's "View details" (issue 12, item 4;
// QCFuse demo paper §4, Figure 4): where each retrieved chunk sat in the prompt, which of its
// tokens were recomputed, the selector's own facts, and its per-token scores (Selection::scores:
// QCFuse's at its critical layers, every other selector's own score, none for random/reuse).
//
// The executor recomputes the same rows P at every layer (QCFuse Eq. 7); only Cache-Craft
// stops the rows of unfocused chunks after its focus layer (Alg. 1), which the details read
// from its `selection.focus` facts as each chunk's last recomputing layer.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/tokenizer.h"

namespace cf {

struct RagRequest;
struct FusionResult;
struct FusionOptions;

struct FusionTrace {
  struct Chunk {
    std::string id;               // the registered-chunk id (content hash of its tokens)
    size_t begin = 0;             // its first prompt position
    std::vector<TokenId> tokens;  // as laid out in the prompt
    bool exact = false;           // part of the exact prefix S' (CRAFT): never fused
  };
  std::string method;
  int n_layers = 0;
  std::vector<Chunk> chunks;       // prompt order
  std::vector<size_t> recomputed;  // prompt positions of context tokens recomputed, ascending
  nlohmann::json selection;        // the selector's details (critical layers, budgets, ...)
  std::vector<double> scores;      // the selector's score per fused context token, from the first fused chunk
  std::string score_kind;          // what the scores are, or why there are none
};

// exact_spans: [begin, end) of the chunks that joined S' (the first of `chunk_order`), the
// others follow S' in rr.chunks. Recomputed: the fused chunks' selected rows, every token of
// a chunk prefilled in full, and the S' chunk tokens past the prefix cache's hit.
FusionTrace make_fusion_trace(const FusionOptions& fusion, int n_layers, const RagRequest& rr,
                              const std::vector<std::string>& chunk_order,
                              const std::vector<std::pair<size_t, size_t>>& exact_spans, const FusionResult& fr);

}  // namespace cf

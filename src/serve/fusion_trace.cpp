#include "serve/fusion_trace.h"

#include <algorithm>

#include "fusion/executor.h"
#include "fusion/rag_prompt.h"

namespace cf {

FusionTrace make_fusion_trace(const FusionOptions& fusion, int n_layers, const RagRequest& rr,
                              const std::vector<std::string>& chunk_order,
                              const std::vector<std::pair<size_t, size_t>>& exact_spans, const FusionResult& fr) {
  FusionTrace t;
  t.method = fusion.method;
  t.n_layers = n_layers;
  t.selection = fr.selection_details;
  t.scores = fr.token_scores;
  t.score_kind = fusion.full() ? "none: full prefill recomputes every token" : fr.score_kind;
  const bool fused = !fusion.full();
  size_t k = 0;
  for (const auto& [b, e] : exact_spans) {
    // S' is computed exactly past what the prefix cache held.
    for (size_t p = std::max(b, fr.prefix_hit_tokens); p < e; ++p) t.recomputed.push_back(p);
    FusionTrace::Chunk c{k < chunk_order.size() ? chunk_order[k] : "", b,
                         std::vector<TokenId>(rr.system.begin() + static_cast<ptrdiff_t>(b),
                                              rr.system.begin() + static_cast<ptrdiff_t>(e)),
                         true};
    t.chunks.push_back(std::move(c));
    ++k;
  }
  size_t pos = rr.system.size();
  for (const auto& tokens : rr.chunks) {
    t.chunks.push_back({k < chunk_order.size() ? chunk_order[k] : "", pos, tokens, false});
    if (!fused)
      for (size_t i = 0; i < tokens.size(); ++i) t.recomputed.push_back(pos + i);
    pos += tokens.size();
    ++k;
  }
  if (fused) t.recomputed.insert(t.recomputed.end(), fr.recomputed.begin(), fr.recomputed.end());
  std::sort(t.recomputed.begin(), t.recomputed.end());
  return t;
}

}  // namespace cf

#include "serve/token_accounting.h"

#include <algorithm>

#include "serve/request_plan.h"

namespace cf {

TokenCounts count_tokens(const RequestPlan& plan, const FusionResult& fr) {
  TokenCounts n;
  const size_t hit = fr.prefix_hit_tokens;
  n.prefix_hit_tokens = hit;
  size_t exact_context_computed = 0;
  for (const auto& [b, e] : plan.exact_spans) {
    if (e <= hit) {
      ++n.chunk_hits;
    } else {
      ++n.chunk_misses;
      exact_context_computed += e - std::max(b, hit);
    }
  }
  const RagRequest& rr = plan.rag;
  if (plan.fused) {
    n.chunk_hits += fr.chunk_hits;
    n.chunk_misses += fr.chunk_misses;
    n.recomputed_tokens = exact_context_computed + fr.recomputed.size();
    n.prefilled_tokens = rr.system.size() - hit + fr.recomputed.size() + rr.suffix.size();
  } else {
    n.chunk_misses += rr.chunks.size();  // prefilled after S'
    n.recomputed_tokens = exact_context_computed + rr.context_tokens();
    n.prefilled_tokens = plan.prompt_tokens - hit;
  }
  return n;
}

}  // namespace cf

#include "serve/token_accounting.h"

#include <algorithm>

#include "serve/request_plan.h"

namespace cf {
namespace {

// Tokens of the chunks the store served (fr.chunk_hit) that the selector did not recompute:
// chunk i spans cache slots [|S| + sum of earlier chunks, + |ci|); fr.recomputed is ascending.
size_t reused_chunk_tokens(const RagRequest& rr, const FusionResult& fr) {
  size_t reused = 0, begin = rr.system.size();
  for (size_t i = 0; i < rr.chunks.size(); ++i) {
    const size_t end = begin + rr.chunks[i].size();
    if (i < fr.chunk_hit.size() && fr.chunk_hit[i]) {
      const auto lo = std::lower_bound(fr.recomputed.begin(), fr.recomputed.end(), begin);
      const auto hi = std::lower_bound(lo, fr.recomputed.end(), end);
      reused += (end - begin) - static_cast<size_t>(hi - lo);
    }
    begin = end;
  }
  return reused;
}

}  // namespace

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
    n.cached_tokens = hit + reused_chunk_tokens(rr, fr);
  } else {
    n.chunk_misses += rr.chunks.size();  // prefilled after S'
    n.recomputed_tokens = exact_context_computed + rr.context_tokens();
    n.prefilled_tokens = plan.prompt_tokens - hit;
    n.cached_tokens = hit;
  }
  return n;
}

}  // namespace cf

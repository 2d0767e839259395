// Token accounting of one completion (issue 25 split it out of the engine): what the prefix
// cache served, which chunks hit or missed, which context tokens were recomputed and which
// tokens went through the forward pass for the prompt. Pure: the plan and the executor's result
// in, the counts out (tests/serve/test_request_plan.cpp).
#pragma once
#include <cstddef>

namespace cf {

struct RequestPlan;
struct FusionResult;

struct TokenCounts {
  size_t prefix_hit_tokens = 0;  // served from the prefix cache
  size_t chunk_hits = 0, chunk_misses = 0;
  size_t recomputed_tokens = 0;  // context tokens recomputed (fused rows, and chunks prefilled exactly)
  size_t prefilled_tokens = 0;   // tokens that went through the forward pass for the prompt
  // Prompt tokens whose K/V was reused rather than computed by this request: the prefix hit
  // and, fused, the tokens of chunks found in the store that were not recomputed (OpenAI's
  // usage.prompt_tokens_details.cached_tokens). A chunk computed now (a miss) is not cached.
  size_t cached_tokens = 0;
};

// The chunks inside S' (the plan's exact spans) count as hits when the prefix cache covered
// them and as misses (their uncovered tokens recomputed) otherwise; a fused request adds the
// executor's chunk hits, misses and recomputed rows; a plain prefill prefills every chunk after
// S' (misses) and everything past the prefix hit, so its cached tokens are the prefix hit alone.
TokenCounts count_tokens(const RequestPlan& plan, const FusionResult& fr);

}  // namespace cf

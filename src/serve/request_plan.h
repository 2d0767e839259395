// The request plan (issue 25): everything the engine decides about a completion before it runs
// anything, as pure functions of the request, its layout and CRAFT's plan, so that each rule is
// tested without a model (tests/serve/test_request_plan.cpp). The engine (engine.cpp) lays the
// request out, asks CRAFT, calls plan_request and executes the plan.
//
// How a request maps onto the executor (S' = the exact prefix, taken from the prefix cache):
//   full, no prefix cache      one plain prefill of S c1..cm U (the reference).
//   full + prefix cache        S' = S c1..cm (longest cached block prefix reused, the rest
//                              prefilled exactly and inserted), then U: vLLM APC-like.
//   full + prefix + reorder    S' = S + the CRAFT keep prefix; the other chunks are prefilled
//                              after it, not inserted (the CP-Tree decides what is kept).
//   method m                   S' = S (+ with reorder the CRAFT keep prefix, exact), the
//                              remaining chunks fused by method m at the ratio.
//   method m, no prefix cache  S computed for this request only, chunks fused.
// CRAFT + fusion: a newly promoted chunk prefix would be prefilled in full on the request's
// critical path, though fusion serves those chunks cheaply. Only the prefix the CP-Tree already
// held joins S' now; the promoted one (RequestPlan::promote) is computed exactly when the
// scheduler is idle, so later requests hit it (deviation from CRAFT, which has no fusion and
// computes the promoted prefix anyway).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fusion/executor.h"
#include "runtime/generate.h"
#include "serve/craft.h"
#include "serve/request.h"
#include "serve/prompt_layout.h"

namespace cf {

// What the engine and its model allow.
struct PlanLimits {
  size_t context_length = 0;     // the model's
  size_t max_prompt_tokens = 0;  // resolved (never 0)
  size_t max_documents = 64;
  std::vector<std::string> chat_stops;  // default stop strings of a chat request (default_chat_stops)
  // Cache-Craft's variants per chunk a request may keep (serve --max-variants, issue 59): each
  // is one more cache file per chunk. A request asking more is 400; one asking none gets the
  // method's default, lowered to this.
  size_t max_variants = 16;
};

struct RequestPlan {
  bool fused = false;         // a fusion method, not full prefill
  bool conversation = false;  // a chat with a conversation id
  bool prefix_cache = true;   // S' comes from the shared prefix cache
  std::string conversation_id;
  FusionOptions fusion;       // method, ratio, options, seed, chunk context
  GenerateOptions generate;   // max tokens (bounded by the context), sampling, stops; no on_text
  RagRequest rag;             // S' (S + the exact chunks), the chunks after it (fused or prefilled), U
  std::vector<std::string> chunk_order;               // chunk ids in prompt order (after CRAFT)
  std::vector<std::pair<size_t, size_t>> exact_spans;  // [begin, end) of each chunk inside S'
  std::vector<TokenId> promote;  // a CRAFT prefix to compute exactly when idle; empty: none
  size_t deduped_chunks = 0;
  size_t history_tokens = 0;
  size_t prompt_tokens = 0;
  // The chunks the executor looks up in the store (FusionExecutor::chunk_keys gives their keys):
  // rag.chunks of a fused request; a plain prefill fetches none.
  bool fetches_chunks() const { return fused && !rag.chunks.empty(); }
};

// 400 on a request the engine refuses before laying it out (fusion, sampling, documents,
// messages): the one check of a request, where it enters the engine; the plan trusts it.
void validate_request(const CompletionRequest& req, const PlanLimits& limits);
// 413 when `tokens` leave no room for one answer token.
void check_prompt_fits(size_t tokens, const PlanLimits& limits, bool chat);
// Whether CRAFT plans this request (reordering asked, or a conversation to dedup).
bool wants_craft(const CompletionRequest& req, const PromptLayout& layout);
// The plan CRAFT would give when it is not asked: request order, nothing dropped or kept.
CraftPlan request_order(size_t chunks);

// The plan. `craft` is CRAFT's answer for this request (or request_order); `seed_if_none` seeds
// sampling when the request names no seed. Throws RequestError 413 when S' + chunks + U does
// not fit.
RequestPlan plan_request(const CompletionRequest& req, const PromptLayout& layout, const CraftPlan& craft,
                         const PlanLimits& limits, uint64_t seed_if_none);

// The prefill rows a plan is expected to cost (serve --schedule shortest, issue 58 item 2): a
// fused request its recomputed share of the chunks plus U (auto: all of the chunks, which its
// ladder may reach; S too without the prefix cache), a plain one every token (what a prefix
// hit saves is not known before the prefill).
size_t expected_prefill_rows(const RequestPlan& plan);

}  // namespace cf

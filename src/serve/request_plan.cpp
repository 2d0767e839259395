#include "serve/request_plan.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "fusion/methods.h"

namespace cf {
namespace {

void validate_messages(const CompletionRequest& req) {
  if (req.chat) {
    if (req.messages.empty()) throw invalid_request("messages must not be empty", "messages");
    for (size_t i = 0; i < req.messages.size(); ++i) {
      const auto& r = req.messages[i].role;
      if (r != "system" && r != "user" && r != "assistant")
        throw invalid_request("messages[" + std::to_string(i) + "].role must be system, user or assistant, got \"" + r + "\"",
                      "messages");
    }
    if (req.messages.back().role != "user") throw invalid_request("the last message must be a user message", "messages");
  } else if (req.prompt.empty()) {
    throw invalid_request("prompt must not be empty", "prompt");
  }
}

// Server ceilings on a method's options (serve --max-variants caps Cache-Craft's max_variants,
// issue 59: each variant is one more cache file per chunk). The method's own parameter list
// says whether it has the option and its default; nullopt: it has none.
constexpr const char* kVariantsOption = "max_variants";
// Read from the catalog, built once: no selector is constructed per request for it.
std::optional<int64_t> option_default(const std::string& method, const char* option) {
  static const nlohmann::json catalog = method_catalog();
  for (const auto& m : catalog) {
    if (m.at("id") != method) continue;
    for (const auto& p : m.at("parameters"))
      if (p.at("name") == option && p.at("default").is_number_integer()) return p.at("default").get<int64_t>();
  }
  return std::nullopt;
}

FusionOptions fusion_options(const CompletionRequest& req, const PlanLimits& limits) {
  FusionOptions fo = req.fusion.options;  // checked by validate_request
  // The method's default variants, never past the server's ceiling when the request names none.
  const bool named = fo.method_options.is_object() && fo.method_options.contains(kVariantsOption);
  if (const auto d = option_default(fo.method, kVariantsOption);
      d && !named && *d > static_cast<int64_t>(limits.max_variants))
    fo.method_options[kVariantsOption] = limits.max_variants;
  fo.seed = req.seed.value_or(0);
  return fo;
}

GenerateOptions generate_options(const CompletionRequest& req, const PlanLimits& limits, size_t prompt_tokens,
                                 uint64_t seed_if_none) {
  GenerateOptions g;
  g.max_tokens = static_cast<int>(std::min<size_t>(req.max_tokens, limits.context_length - prompt_tokens));
  g.sampling.temperature = static_cast<float>(req.temperature);
  g.sampling.top_p = static_cast<float>(req.top_p);
  g.sampling.top_k = 0;  // OpenAI's API has neither top-k nor min-p
  g.sampling.min_p = 0.0f;
  g.sampling.seed = req.seed ? *req.seed : seed_if_none;
  g.stop = req.stop.empty() && req.chat ? limits.chat_stops : req.stop;
  return g;
}

// The registry names the method, the method judges its options, a client names no file.
void validate_fusion(const FusionSpec& f) {
  try {
    validate_fusion_options(f.options, OptionsSource::api);
  } catch (const FusionOptionsError& e) {
    throw invalid_request(e.what(), e.param);
  }
}

}  // namespace

void validate_request(const CompletionRequest& req, const PlanLimits& limits) {
  const size_t ctx = limits.context_length;
  validate_fusion(req.fusion);
  if (const nlohmann::json& o = req.fusion.options.method_options;
      o.is_object() && option_default(req.fusion.options.method, kVariantsOption))
    if (auto v = o.find(kVariantsOption);
        v != o.end() && v->is_number_integer() && v->get<int64_t>() > static_cast<int64_t>(limits.max_variants))
      throw invalid_request("fusion.options.max_variants " + std::to_string(v->get<int64_t>()) + " is over this server's " +
                                std::to_string(limits.max_variants) +
                                " (serve --max-variants: each variant is one more cache file per chunk)",
                            "fusion.options");
  if (req.max_tokens <= 0) throw invalid_request("max_tokens must be at least 1", "max_tokens");
  if (static_cast<size_t>(req.max_tokens) > ctx)
    throw invalid_request("max_tokens " + std::to_string(req.max_tokens) + " exceeds the context of " + std::to_string(ctx),
                  "max_tokens");
  if (!std::isfinite(req.temperature) || req.temperature < 0 || req.temperature > 2)
    throw invalid_request("temperature must be in [0, 2]", "temperature");
  if (!(req.top_p > 0 && req.top_p <= 1)) throw invalid_request("top_p must be in (0, 1]", "top_p");
  if (req.documents.size() > limits.max_documents)
    throw invalid_request(std::to_string(req.documents.size()) + " documents; at most " +
                      std::to_string(limits.max_documents) + " per request",
                  "documents");
  validate_messages(req);
}

void check_prompt_fits(size_t tokens, const PlanLimits& limits, bool chat) {
  if (tokens + 1 <= limits.max_prompt_tokens) return;
  throw invalid_request("prompt of " + std::to_string(tokens) + " tokens leaves no room to answer under the limit of " +
                             std::to_string(limits.max_prompt_tokens) + " tokens",
                         chat ? "messages" : "prompt", 413);
}

bool wants_craft(const CompletionRequest& req, const PromptLayout& layout) {
  const bool conversation = req.chat && !req.fusion.conversation_id.empty();
  return !layout.chunks.empty() && (req.fusion.reorder || conversation);
}

CraftPlan request_order(size_t chunks) {
  CraftPlan p;
  p.order.resize(chunks);
  for (size_t i = 0; i < chunks; ++i) p.order[i] = i;
  return p;
}

RequestPlan plan_request(const CompletionRequest& req, const PromptLayout& l, const CraftPlan& craft,
                         const PlanLimits& limits, uint64_t seed_if_none) {
  const FusionSpec& f = req.fusion;
  RequestPlan p;
  p.fused = !f.options.full();
  p.conversation = req.chat && !f.conversation_id.empty();
  p.conversation_id = p.conversation ? f.conversation_id : std::string();
  p.prefix_cache = f.prefix_cache;
  p.history_tokens = l.history_tokens;
  p.fusion = fusion_options(req, limits);
  p.deduped_chunks = craft.dropped.size();

  // The chunk prefix CRAFT keeps exact, and the part of it the CP-Tree held before this request.
  const std::vector<size_t>& order = craft.order;
  const size_t keep_chunks = std::min(craft.keep_chunks, order.size());
  const size_t matched_chunks = std::min(craft.matched_chunks, keep_chunks);
  size_t exact_chunks = 0;  // leading chunks that join S' (exact, through the prefix cache)
  if (f.prefix_cache) exact_chunks = f.reorder ? keep_chunks : (p.fused ? 0 : order.size());
  if (p.fused && f.reorder && f.prefix_cache && keep_chunks > matched_chunks) {
    p.promote = l.system;
    for (size_t k = 0; k < keep_chunks; ++k)
      p.promote.insert(p.promote.end(), l.chunks[order[k]].begin(), l.chunks[order[k]].end());
    exact_chunks = matched_chunks;
  }

  p.rag.system = l.system;
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& c = l.chunks[order[k]];
    p.chunk_order.push_back(l.chunk_ids[order[k]]);
    if (k < exact_chunks) {
      p.exact_spans.emplace_back(p.rag.system.size(), p.rag.system.size() + c.size());
      p.rag.system.insert(p.rag.system.end(), c.begin(), c.end());
    } else {
      p.rag.chunks.push_back(c);
    }
  }
  p.rag.suffix = l.suffix;
  p.prompt_tokens = p.rag.system.size() + p.rag.context_tokens() + p.rag.suffix.size();
  check_prompt_fits(p.prompt_tokens, limits, req.chat);
  p.generate = generate_options(req, limits, p.prompt_tokens, seed_if_none);
  return p;
}

size_t expected_prefill_rows(const RequestPlan& plan) {
  const RagRequest& r = plan.rag;
  const size_t context = r.context_tokens();
  if (!plan.fused) return r.system.size() + context + r.suffix.size();
  const size_t s = plan.prefix_cache ? 0 : r.system.size();
  if (plan.fusion.automatic()) return s + context + r.suffix.size();
  return s + static_cast<size_t>(std::ceil(plan.fusion.ratio * static_cast<double>(context))) + r.suffix.size();
}

}  // namespace cf

// The fusion part of a request's contract (issue 61): which method, at what ratio or quality,
// with which options and chunk caches. Built by whoever parses a request (the server's JSON,
// a command's flags), checked once by validate_fusion_options where it enters the engine, then
// trusted by the plan and the executor.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "kv/chunk_key.h"

namespace cf {

struct FusionOptions {
  std::string method = "full";  // a name of the method registry (fusion/methods.h)
  double ratio = 0.15;
  uint64_t seed = 0;
  nlohmann::json method_options = nlohmann::json::object();  // Selector::configure
  // Which base cache each chunk is served from (chunk_key.h): alone (PIC) or prefixed
  // (computed after this request's S). Every selector runs on both; full prefill ignores it.
  ChunkContext chunk_context = ChunkContext::alone;
  // method "auto" (fusion/auto_quality.h): the probability, in (0, 1], of an answer identical
  // to full prefill's that the request asks for; the policy picks the method and the ratio.
  double quality = 0;
  // method "auto": the first-token budget in ms (issue 60 item 1; auto_quality.h); 0: none.
  // With it, quality may be 0 (the best plan that fits) or a target (the cheapest meeting it
  // within the budget).
  double ttft_ms = 0;

  // The method's kind in the registry (false for an unknown name: validate first).
  bool full() const;       // plain prefill, no fusion
  bool automatic() const;  // the auto policy
};

// Who wrote the options. A client's request must not make the server read files: from the
// API a string option with listed values (MethodParam::values, e.g. QCFuse's shipped profile
// names) takes one of them only; trusted callers (the CLI, benchmarks) may give a path.
enum class OptionsSource { trusted, api };

// A setting no method accepts; `param` names the request field ("fusion.method", ...).
struct FusionOptionsError : std::invalid_argument {
  FusionOptionsError(std::string param, const std::string& message)
      : std::invalid_argument(message), param(std::move(param)) {}
  std::string param;
};

// The one check: the method is in the registry; auto has a quality in (0, 1], a ttft_ms > 0 or
// both, and no options; quality and ttft_ms are for auto only; full takes no options; a selector accepts its options (it judges
// them itself: Selector::configure); the ratio is in [0, 1].
void validate_fusion_options(const FusionOptions& o, OptionsSource source);

}  // namespace cf

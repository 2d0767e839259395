// The request contract of the server (issue 61): what a client asks (CompletionRequest), what
// it gets back (CompletionResult, ChunkInfo) and how a refusal is said (RequestError). The HTTP
// layer, passage matching, the knowledge base and the plan speak these types; only the few
// files that drive the Engine include serve/engine.h.
//
// Prompt layout of a RAG request (docs/ARCHITECTURE.md): S = the chat template up to the last user
// message's content (system message and earlier turns included), then one chunk per
// document, then U = the last user message and the template's assistant header. Without
// documents the whole rendered prompt is S + U. Completions (`prompt`) use no template.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusion/fusion_options.h"
#include "model/chat_template.h"
#include "serve/token_accounting.h"

namespace cf {

struct FusionTrace;  // serve/fusion_trace.h

inline constexpr const char* kInvalidRequestError = "invalid_request_error";

// A request the engine refuses: the HTTP layer maps it to `status` with an OpenAI-style
// error body {"error": {"message", "type", "param", "code"}}.
struct RequestError : std::runtime_error {
  RequestError(int status, std::string type, std::string message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;         // 400 bad request, 404 unknown chunk, 413 too large, 429/503 queue full, 507 disk full
  std::string type;   // "invalid_request_error", "not_found_error", ...
  std::string param;  // offending field, when there is one
  std::string code;   // the body's "code" ("server_busy"), when there is one
};

// ChatMessage {role: system | user | assistant, content} is the chat template's own
// (model/chat_template.h): one type from the HTTP layer down to the renderer.

struct DocumentRef {
  std::string text;  // inline passage text, or
  std::string id;    // a registered chunk id (POST /v1/chunks)
};

// A request's fusion settings: the fusion contract (fusion/fusion_options.h: method, ratio,
// quality, method options, chunk context; the plan sets the seed) and what the server adds.
struct FusionSpec {
  FusionOptions options;        // checked once, by validate_request (serve/request_plan.h)
  bool reorder = false;         // CRAFT reordering (can change answers: off by default)
  std::string conversation_id;  // CRAFT conversation-scoped dedup; empty: none
  bool prefix_cache = true;     // use the shared exact prefix cache
};

// Set by passage matching (serve/passage_matching.h, issue 27): the request's documents are
// passages cut out of message `message` (or of the prompt), which is laid out as
// [.. before][documents][after ..] instead of S documents U.
struct InlinePassages {
  size_t message = 0;         // index into messages (chat)
  std::string before, after;  // the message's (prompt's) text around the passages
  size_t passages = 0, registered = 0, glue = 0;  // documents that are passages / registered texts / glue
};

struct CompletionRequest {
  bool chat = true;
  std::vector<ChatMessage> messages;  // chat
  std::string prompt;                 // completions
  std::vector<DocumentRef> documents;
  FusionSpec fusion;
  int max_tokens = 128;
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;
  std::optional<uint64_t> seed;
  int priority = 0;  // serve --schedule priority: lower is served first (vLLM's "priority")
  std::vector<std::string> stop;
  std::string model;  // echoed back
  std::optional<InlinePassages> inline_passages;  // never from the API: set by passage matching
};

struct CompletionTimings {
  double queue_ms = 0, lookup_ms = 0, load_ms = 0, selection_ms = 0, recompute_ms = 0;
  double ttft_ms = 0;    // from arrival (queue included) to the first token chosen
  double decode_ms = 0;
};

// The token counts of the prompt's work (prefix hits, chunk hits and misses, recomputed and
// prefilled tokens) are its TokenCounts (serve/token_accounting.h).
struct CompletionResult : TokenCounts {
  std::string text;
  std::string finish_reason;  // "stop" | "length" (a cancelled request: "stop", cancelled set)
  bool cancelled = false;     // on_text returned false
  size_t history_tokens = 0;  // tokens of earlier turns of the conversation at the start of S
  size_t prompt_tokens = 0, completion_tokens = 0;
  std::vector<std::string> chunk_order;  // chunk ids in prompt order (after CRAFT)
  size_t deduped_chunks = 0;
  CompletionTimings timings;
  std::shared_ptr<const FusionTrace> trace;  // positions and selector facts, for the web page's details
  nlohmann::json passages;           // passage matching's report (null: not matched)
  nlohmann::json auto_choice;        // method auto: what the policy chose (AutoDecision::to_json); else null
  // serve --self-check (serve/self_check.h): this answer's plan, whether it was sampled, the
  // plan's record so far; null when off or the answer is not one it checks (GET /v1/details).
  nlohmann::json self_check;
  nlohmann::json to_json() const;    // the "chunkfuse" extension object of a response
};

struct ChunkInfo {
  std::string id;
  size_t n_tokens = 0;
  bool cached = false;  // its cache is in the store
  std::string text;
};

// The refusal of a field the client got wrong: `status` (400 unless said) with type
// invalid_request_error, naming the field in `param`. The one helper every layer uses.
inline RequestError invalid_request(const std::string& message, std::string param = "", int status = 400) {
  return RequestError(status, kInvalidRequestError, message, std::move(param));
}

}  // namespace cf

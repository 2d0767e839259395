// cf::api: the pure translation between the HTTP API's JSON and the engine's types (request
// parsing and validation, response and streaming bodies, errors, /v1/models, Prometheus text),
// testable without a socket or a model. HttpServer (server.h) wires it to httplib.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "serve/request.h"
#include "serve/request_metrics.h"

namespace cf {

namespace api {

// fusion.conversation_id's length in bytes at most (400 past it, issue 59).
inline constexpr size_t kMaxConversationIdBytes = 256;

// A completion call's body, as the engine needs it, plus how to answer it.
struct ParsedCompletion {
  CompletionRequest request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a final chunk with usage
};

// Parses a request body; malformed JSON or a body that is not an object is a 400.
nlohmann::json parse_body(const std::string& body);

// Validates an OpenAI-style body (chat: /v1/chat/completions, else /v1/completions). Unknown
// fields are ignored, as OpenAI does; a known field of the wrong type or out of range throws
// RequestError 400 naming the field, and so does an OpenAI field that would change the answer
// and is not implemented (logprobs, echo, logit_bias, tools, response_format, n > 1, ...)
// unless it is null or "off". `defaults` (serve --method, --ratio, --quality, --chunk-context)
// fill the fusion fields a request does not give; a request naming a method other than auto
// does not inherit the default quality. The fusion settings are checked by validate_request.
ParsedCompletion parse_completion(const nlohmann::json& body, bool chat, const FusionOptions& defaults = {});

// POST /v1/chunks: {"texts": [str...]} or {"documents": [str | {"text": str}...]}.
std::vector<std::string> parse_chunk_texts(const nlohmann::json& body);

// {"error": {"message", "type", "param", "code"}} (param and code null when unknown).
nlohmann::json error_body(int status, const std::string& type, const std::string& message,
                          const std::string& param = "");
nlohmann::json error_body(const RequestError& e);

// What every response object of one request shares.
struct ResponseMeta {
  std::string id;      // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0; // Unix seconds
  std::string model;
  bool chat = true;
};

nlohmann::json usage_json(const CompletionResult& r);
nlohmann::json completion_response(const ResponseMeta& m, const CompletionResult& r);
// Streaming chunks: the first (chat: delta with the role), one per piece of text, the last
// (finish_reason; with method auto also chunkfuse.auto, the choice), and with include_usage one
// with empty choices, the usage and the whole chunkfuse object.
nlohmann::json stream_role_chunk(const ResponseMeta& m);
nlohmann::json stream_text_chunk(const ResponseMeta& m, std::string_view text);
nlohmann::json stream_finish_chunk(const ResponseMeta& m, const CompletionResult& r);
nlohmann::json stream_usage_chunk(const ResponseMeta& m, const CompletionResult& r);
// One server-sent event: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// Compact JSON text; invalid UTF-8 (a piece that splits a character) becomes U+FFFD
// instead of throwing.
std::string dump(const nlohmann::json& j);

nlohmann::json chunk_json(const ChunkInfo& c, bool with_text);
nlohmann::json models_json(const std::string& model_name, int64_t created);
// GET /v1/methods: {"object": "list", "default": serve --method, "defaults": {"method", "ratio",
// "quality"?, "ttft_ms"?, "fusion_method"} (the server's fusion for requests naming none, and the
// fusion method a client that wants one starts from), "data": [{"id",
// "object": "method", "parameters": [{"name", "type", "default", "values"?, "help"}]}]}, from the
// method registry (fusion/methods.h method_catalog): what fusion.method and fusion.options accept.
nlohmann::json methods_json(const FusionOptions& defaults);

// Counters of the HTTP layer itself (requests the engine never saw, e.g. malformed JSON).
struct HttpCounters {
  uint64_t responses_2xx = 0, responses_4xx = 0, responses_5xx = 0;
  uint64_t streams_cancelled = 0;
  uint64_t unauthorized = 0;                                  // 401s
  uint64_t connections_refused = 0, connection_timeouts = 0;  // at the cap / past the deadline
  uint64_t connections_open = 0;
  uint64_t knowledge_failures = 0;  // KnowledgeBase::background_failures
  uint64_t chunk_texts_in_flight = 0, chunk_posts_refused = 0;  // KeyQuota (POST /v1/chunks)
};

// GET /metrics in Prometheus text exposition format 0.0.4. `cache_use` false (under
// --isolate-keys) leaves out every series that moves with cache hits (prefilled and prefix
// tokens, chunk hits, the store's and the remote tier's counters and bytes): comparing them
// around a request would tell a key whether another key sent the same text (issue 29, item 6).
std::string prometheus_text(const EngineMetrics& m, const HttpCounters& h, bool cache_use = true);

}  // namespace api

}  // namespace cf

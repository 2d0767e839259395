// Request parsing and response formatting of the OpenAI-compatible API (see api_json.h).
// Field rules follow OpenAI's API reference: null means "not given", unknown fields are
// ignored, a known field of the wrong type is a 400 that names it, and so is a field that
// would change the answer but is not implemented (kAnswerChangingFields).
#include "serve/api_json.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "base/bounded_json.h"
#include "fusion/methods.h"
#include "serve/store_metrics.h"

namespace cf {

using nlohmann::json;

nlohmann::json CompletionResult::to_json() const {
  json j{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"prefix_hit_tokens", prefix_hit_tokens},
              {"prefilled_tokens", prefilled_tokens},
              {"recomputed_tokens", recomputed_tokens},
              {"chunk_hits", chunk_hits},
              {"chunk_misses", chunk_misses},
              {"chunk_order", chunk_order},
              {"deduped_chunks", deduped_chunks},
              {"history_tokens", history_tokens},
              {"cancelled", cancelled},
              {"timings_ms",
               {{"queue", timings.queue_ms},
                {"lookup", timings.lookup_ms},
                {"load", timings.load_ms},
                {"selection", timings.selection_ms},
                {"recompute", timings.recompute_ms},
                {"ttft", timings.ttft_ms},
                {"decode", timings.decode_ms}}}};
  if (!passages.is_null()) j["passages"] = passages;  // serve --match-chunks (passage_matching.h)
  if (!auto_choice.is_null()) j["auto"] = auto_choice;  // fusion method auto (fusion/auto_quality.h)
  return j;
}

namespace api {
namespace {

// The field when present and not null, else nullptr.
const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string get_string(const json& v, const std::string& param) {
  if (!v.is_string()) throw invalid_request("'" + param + "' must be a string", param);
  return v.get<std::string>();
}

bool get_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) throw invalid_request("'" + param + "' must be a boolean", param);
  return v.get<bool>();
}

double get_number(const json& v, const std::string& param, double lo, double hi) {
  if (!v.is_number()) throw invalid_request("'" + param + "' must be a number", param);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    std::ostringstream os;
    os << "'" << param << "' must be in [" << lo << ", " << hi << "], got " << x;
    throw invalid_request(os.str(), param);
  }
  return x;
}

int64_t get_int(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  // 16.0 is an integer to JSON Schema and to OpenAI; 16.5 is not.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) throw invalid_request("'" + param + "' must be an integer", param);
  } else if (!v.is_number_integer()) {
    throw invalid_request("'" + param + "' must be an integer", param);
  }
  const double x = v.get<double>();
  if (x < static_cast<double>(lo) || x > static_cast<double>(hi))
    throw invalid_request("'" + param + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", param);
  return v.get<int64_t>();
}

// Message content: a string, or OpenAI's list of parts of which only text parts are
// supported (joined, as OpenAI does for system messages).
std::string message_content(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) throw invalid_request("'" + param + "' must be a string or a list of text parts", param);
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const json& part = v[i];
    if (!part.is_object()) throw invalid_request("'" + p + "' must be an object", p);
    const json* type = field(part, "type");
    if (!type || get_string(*type, p + ".type") != "text") throw invalid_request("only content parts of type 'text' are supported", p + ".type");
    const json* text = field(part, "text");
    if (!text) throw invalid_request("'" + p + ".text' is required", p + ".text");
    out += get_string(*text, p + ".text");
  }
  return out;
}

std::vector<ChatMessage> parse_messages(const json& body) {
  const json* msgs = field(body, "messages");
  if (!msgs) throw invalid_request("'messages' is required", "messages");
  if (!msgs->is_array()) throw invalid_request("'messages' must be a list", "messages");
  if (msgs->empty()) throw invalid_request("'messages' must not be empty", "messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const json& m = (*msgs)[i];
    if (!m.is_object()) throw invalid_request("'" + p + "' must be an object", p);
    const json* role = field(m, "role");
    if (!role) throw invalid_request("'" + p + ".role' is required", p + ".role");
    std::string r = get_string(*role, p + ".role");
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r != "system" && r != "user" && r != "assistant")
      throw invalid_request("unsupported role '" + r + "' (system, developer, user, assistant)", p + ".role");
    const json* content = field(m, "content");
    if (!content && r != "assistant") throw invalid_request("'" + p + ".content' is required", p + ".content");
    out.push_back({r, content ? message_content(*content, p + ".content") : std::string()});
  }
  return out;
}

std::string parse_prompt(const json& body) {
  const json* prompt = field(body, "prompt");
  if (!prompt) throw invalid_request("'prompt' is required", "prompt");
  if (prompt->is_string()) return prompt->get<std::string>();
  // The openai client sends a list for batched prompts; one prompt per request here.
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) return (*prompt)[0].get<std::string>();
  throw invalid_request("'prompt' must be a string (or a list of exactly one string)", "prompt");
}

std::vector<DocumentRef> parse_documents(const json& v) {
  if (!v.is_array()) throw invalid_request("'documents' must be a list", "documents");
  std::vector<DocumentRef> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = "documents[" + std::to_string(i) + "]";
    const json& d = v[i];
    DocumentRef ref;
    if (d.is_string()) {
      ref.text = d.get<std::string>();
    } else if (d.is_object()) {
      const json* id = field(d, "id");
      const json* text = field(d, "text");
      if ((id != nullptr) == (text != nullptr)) throw invalid_request("'" + p + "' needs exactly one of 'id' and 'text'", p);
      if (id) ref.id = get_string(*id, p + ".id");
      if (text) ref.text = get_string(*text, p + ".text");
      if (id && ref.id.empty()) throw invalid_request("'" + p + ".id' must not be empty", p + ".id");
    } else {
      throw invalid_request("'" + p + "' must be a string or an object with 'id' or 'text'", p);
    }
    if (ref.id.empty() && ref.text.empty()) throw invalid_request("'" + p + "' is an empty passage", p);
    out.push_back(std::move(ref));
  }
  return out;
}

// Types and ranges only: what the method accepts is checked once, by validate_request.
FusionSpec parse_fusion(const json* v, const FusionOptions& defaults) {
  FusionSpec f;
  f.options = defaults;
  FusionOptions& o = f.options;
  if (!v) return f;
  if (!v->is_object()) throw invalid_request("'fusion' must be an object", "fusion");
  if (const json* x = field(*v, "method")) o.method = get_string(*x, "fusion.method");
  if (const json* x = field(*v, "ratio")) o.ratio = get_number(*x, "fusion.ratio", 0.0, 1.0);
  // serve --quality's target and --ttft-ms's budget belong to their default method, auto: a
  // request naming another method without its own does not inherit them.
  const bool other_method = field(*v, "method") && !o.automatic();
  if (const json* x = field(*v, "quality")) o.quality = get_number(*x, "fusion.quality", 0.0, 1.0);
  else if (other_method) o.quality = 0;
  if (const json* x = field(*v, "ttft_ms")) o.ttft_ms = get_number(*x, "fusion.ttft_ms", 0.0, 3.6e6);
  else if (other_method) o.ttft_ms = 0;
  if (o.automatic() && field(*v, "ratio"))
    throw invalid_request("fusion method '" + o.method + "' chooses the ratio itself: give fusion.quality or fusion.ttft_ms, not fusion.ratio", "fusion.ratio");
  if (const json* x = field(*v, "reorder")) f.reorder = get_bool(*x, "fusion.reorder");
  if (const json* x = field(*v, "conversation_id")) {
    // A key of CRAFT's conversation maps and of the conversation memory, each kept twice:
    // bounded like any request-controlled size (issue 59; it was bounded by --max-body only).
    f.conversation_id = get_string(*x, "fusion.conversation_id");
    if (f.conversation_id.size() > kMaxConversationIdBytes)
      throw invalid_request("'fusion.conversation_id' holds at most " + std::to_string(kMaxConversationIdBytes) +
                                " bytes",
                            "fusion.conversation_id");
  }
  if (const json* x = field(*v, "prefix_cache")) f.prefix_cache = get_bool(*x, "fusion.prefix_cache");
  // chunk_context; "chunk_variant" is its name before issue 25, still accepted.
  const json* cc = field(*v, "chunk_context");
  if (!cc) cc = field(*v, "chunk_variant");
  if (cc && !parse_chunk_context(get_string(*cc, "fusion.chunk_context"), o.chunk_context))
    throw invalid_request("'fusion.chunk_context' must be \"alone\" or \"prefixed\"", "fusion.chunk_context");
  if (const json* x = field(*v, "options")) {
    if (!x->is_object()) throw invalid_request("'fusion.options' must be an object", "fusion.options");
    o.method_options = *x;
  }
  return f;
}

// Stop strings are matched on the scheduler thread after every token, and the held-back
// prefix of each is compared at every length (quadratic in its size): OpenAI allows 4; we
// allow 16 of at most 256 bytes each (issue 59).
constexpr size_t kMaxStops = 16, kMaxStopBytes = 256;

std::string stop_string(const json& v, const std::string& param) {
  std::string s = get_string(v, param);
  if (s.empty()) throw invalid_request("stop sequences must not be empty", param);
  if (s.size() > kMaxStopBytes)
    throw invalid_request("'" + param + "' is " + std::to_string(s.size()) + " bytes; a stop sequence holds at most " +
                   std::to_string(kMaxStopBytes) + " bytes", param);
  return s;
}

std::vector<std::string> parse_stop(const json& v) {
  if (v.is_string()) return {stop_string(v, "stop")};
  if (!v.is_array()) throw invalid_request("'stop' must be a string or a list of strings", "stop");
  if (v.size() > kMaxStops) throw invalid_request("'stop' holds at most " + std::to_string(kMaxStops) + " sequences", "stop");
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(stop_string(v[i], "stop[" + std::to_string(i) + "]"));
  return out;
}

// OpenAI fields that would change what the answer is (its shape or its content) and that the
// engine does not implement: a value other than "off" is a 400 naming the field, never silently
// ignored (issue 59). Null and the off values, which SDKs send, are accepted.
struct AnswerChangingField {
  const char* name;
  bool (*off)(const json&);
  const char* off_values;  // for the message
};

bool is_false_or_zero(const json& v) { return (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v == 0); }
bool is_one(const json& v) { return v.is_number() && v == 1; }
bool is_empty(const json& v) {
  return ((v.is_array() || v.is_object()) && v.empty()) || (v.is_string() && v.get_ref<const std::string&>().empty());
}
bool is_text_format(const json& v) { return v.is_object() && v.size() == 1 && v.value("type", json()) == "text"; }
// Without tools (refused above), "auto" chooses no tool.
bool is_no_tool(const json& v) { return v == "none" || v == "auto"; }

constexpr AnswerChangingField kAnswerChangingFields[] = {
    {"logprobs", is_false_or_zero, "false or 0"},
    {"top_logprobs", is_false_or_zero, "0"},
    {"echo", is_false_or_zero, "false"},
    {"logit_bias", is_empty, "{}"},
    {"tools", is_empty, "[]"},
    {"tool_choice", is_no_tool, "\"none\" or \"auto\""},
    {"functions", is_empty, "[]"},
    {"function_call", is_no_tool, "\"none\" or \"auto\""},
    {"response_format", is_text_format, "{\"type\": \"text\"}"},
    {"n", is_one, "1"},
    {"best_of", is_one, "1"},
    {"suffix", is_empty, "\"\""},
};

void refuse_answer_changing_fields(const json& body) {
  for (const auto& f : kAnswerChangingFields) {
    const json* x = field(body, f.name);
    if (x && !f.off(*x))
      throw invalid_request(std::string("'") + f.name + "' is not supported: only " + f.off_values + " or null", f.name);
  }
}

}  // namespace

json parse_body(const std::string& body) {
  json j;
  try {
    j = parse_json_bounded(body, /*allow_exceptions=*/false);
  } catch (const JsonTooDeep& e) {
    // Refused before anything copies or prints the value (issue 29, item 1).
    throw invalid_request("the body nests arrays or objects deeper than " + std::to_string(e.limit) + " levels");
  }
  if (j.is_discarded()) throw invalid_request("the body is not valid JSON");
  if (!j.is_object()) throw invalid_request("the body must be a JSON object");
  return j;
}

ParsedCompletion parse_completion(const json& body, bool chat, const FusionOptions& defaults) {
  ParsedCompletion pc;
  CompletionRequest& r = pc.request;
  r.chat = chat;
  refuse_answer_changing_fields(body);
  if (const json* x = field(body, "model")) r.model = get_string(*x, "model");
  if (chat)
    r.messages = parse_messages(body);
  else
    r.prompt = parse_prompt(body);
  // max_completion_tokens is the newer name; OpenAI lets it win when both are given.
  constexpr int64_t kMaxTokens = 1 << 20;
  if (const json* x = field(body, "max_tokens")) r.max_tokens = static_cast<int>(get_int(*x, "max_tokens", 1, kMaxTokens));
  if (const json* x = field(body, "max_completion_tokens"))
    r.max_tokens = static_cast<int>(get_int(*x, "max_completion_tokens", 1, kMaxTokens));
  if (const json* x = field(body, "temperature")) r.temperature = get_number(*x, "temperature", 0.0, 2.0);
  if (const json* x = field(body, "top_p")) {
    r.top_p = get_number(*x, "top_p", 0.0, 1.0);
    if (r.top_p <= 0.0) throw invalid_request("'top_p' must be greater than 0", "top_p");
  }
  if (const json* x = field(body, "priority"))
    r.priority = static_cast<int>(get_int(*x, "priority", std::numeric_limits<int32_t>::min(),
                                          std::numeric_limits<int32_t>::max()));
  if (const json* x = field(body, "seed"))
    r.seed = static_cast<uint64_t>(
        get_int(*x, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  if (const json* x = field(body, "stop")) r.stop = parse_stop(*x);
  if (const json* x = field(body, "stream")) pc.stream = get_bool(*x, "stream");
  if (const json* x = field(body, "stream_options")) {
    if (!x->is_object()) throw invalid_request("'stream_options' must be an object", "stream_options");
    if (const json* u = field(*x, "include_usage")) pc.include_usage = get_bool(*u, "stream_options.include_usage");
  }
  if (const json* x = field(body, "documents")) r.documents = parse_documents(*x);
  r.fusion = parse_fusion(field(body, "fusion"), defaults);
  return pc;
}

std::vector<std::string> parse_chunk_texts(const json& body) {
  const json* texts = field(body, "texts");
  const json* docs = field(body, "documents");
  if ((texts != nullptr) == (docs != nullptr)) throw invalid_request("give exactly one of 'texts' and 'documents'", "texts");
  const char* name = texts ? "texts" : "documents";
  const json& list = texts ? *texts : *docs;
  if (!list.is_array()) throw invalid_request(std::string("'") + name + "' must be a list", name);
  if (list.empty()) throw invalid_request(std::string("'") + name + "' must not be empty", name);
  std::vector<std::string> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string p = std::string(name) + "[" + std::to_string(i) + "]";
    const json& d = list[i];
    std::string text;
    if (d.is_string()) {
      text = d.get<std::string>();
    } else if (docs && d.is_object() && field(d, "text")) {
      text = get_string(*field(d, "text"), p + ".text");
    } else {
      throw invalid_request("'" + p + (docs ? "' must be a string or an object with 'text'" : "' must be a string"), p);
    }
    if (text.empty()) throw invalid_request("'" + p + "' is an empty passage", p);
    out.push_back(std::move(text));
  }
  return out;
}

json error_body(int status, const std::string& type, const std::string& message, const std::string& param) {
  (void)status;
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", nullptr}}}};
}

json error_body(const RequestError& e) {
  json body = error_body(e.status, e.type, e.what(), e.param);
  if (!e.code.empty()) body["error"]["code"] = e.code;
  return body;
}

json usage_json(const CompletionResult& r) {
  // cached_tokens: the prompt tokens whose K/V was reused (token_accounting.h), never more than the prompt.
  return json{{"prompt_tokens", r.prompt_tokens},
              {"completion_tokens", r.completion_tokens},
              {"total_tokens", r.prompt_tokens + r.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", std::min(r.cached_tokens, r.prompt_tokens)}}}};
}

namespace {
json base_object(const ResponseMeta& m, const char* object) {
  return json{{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
}
const char* chunk_object(const ResponseMeta& m) { return m.chat ? "chat.completion.chunk" : "text_completion"; }
}  // namespace

json completion_response(const ResponseMeta& m, const CompletionResult& r) {
  json j = base_object(m, m.chat ? "chat.completion" : "text_completion");
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", r.finish_reason}};
  if (m.chat)
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
  else
    choice["text"] = r.text;
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(r);
  j["chunkfuse"] = r.to_json();
  return j;
}

json stream_role_chunk(const ResponseMeta& m) {
  json j = base_object(m, chunk_object(m));
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (m.chat)
    choice["delta"] = {{"role", "assistant"}, {"content", ""}};
  else
    choice["text"] = "";
  j["choices"] = json::array({choice});
  return j;
}

json stream_text_chunk(const ResponseMeta& m, std::string_view text) {
  json j = base_object(m, chunk_object(m));
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (m.chat)
    choice["delta"] = {{"content", std::string(text)}};
  else
    choice["text"] = std::string(text);
  j["choices"] = json::array({choice});
  return j;
}

json stream_finish_chunk(const ResponseMeta& m, const CompletionResult& r) {
  json j = base_object(m, chunk_object(m));
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", r.finish_reason}};
  if (m.chat)
    choice["delta"] = json::object();
  else
    choice["text"] = "";
  j["choices"] = json::array({choice});
  // The auto policy's choice in every stream, not only with stream_options.include_usage.
  if (!r.auto_choice.is_null()) j["chunkfuse"] = {{"auto", r.auto_choice}};
  return j;
}

json stream_usage_chunk(const ResponseMeta& m, const CompletionResult& r) {
  json j = base_object(m, chunk_object(m));
  j["choices"] = json::array();
  j["usage"] = usage_json(r);
  j["chunkfuse"] = r.to_json();
  return j;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }

json chunk_json(const ChunkInfo& c, bool with_text) {
  json j{{"id", c.id}, {"object", "chunk"}, {"n_tokens", c.n_tokens}, {"cached", c.cached}};
  if (with_text) j["text"] = c.text;
  return j;
}

json models_json(const std::string& model_name, int64_t created) {
  return json{{"object", "list"},
              {"data", json::array({json{{"id", model_name}, {"object", "model"}, {"created", created},
                                         {"owned_by", "chunkfuse"}}})}};
}

json methods_json(const FusionOptions& defaults) {
  json data = method_catalog();
  for (auto& m : data) m["object"] = "method";
  // What a request that names no fusion field gets (serve --method, --ratio, --quality,
  // --ttft-ms): the page starts from it and sends none of them while it is unchanged.
  json d{{"method", defaults.method}, {"ratio", defaults.ratio}, {"fusion_method", default_fusion_method_name()}};
  if (defaults.quality > 0) d["quality"] = defaults.quality;
  if (defaults.ttft_ms > 0) d["ttft_ms"] = defaults.ttft_ms;
  return json{{"object", "list"}, {"default", defaults.method}, {"defaults", std::move(d)}, {"data", std::move(data)}};
}

namespace {

// Prometheus wants plain decimal numbers; "+Inf" for the last bucket.
std::string num(double x) {
  std::ostringstream os;
  os.precision(15);  // enough for ms sums; avoids 0.10000000000000001
  os << x;
  return os.str();
}

void metric(std::ostringstream& os, const char* name, const char* type, const char* help) {
  os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

// One unlabelled counter or gauge sample with its HELP and TYPE lines.
struct SeriesWriter {
  std::ostringstream& os;
  void counter(const char* name, const char* help, uint64_t v) const {
    metric(os, name, "counter", help);
    os << name << ' ' << v << '\n';
  }
  void gauge(const char* name, const char* help, double v) const {
    metric(os, name, "gauge", help);
    os << name << ' ' << num(v) << '\n';
  }
};

// The HTTP layer's series (HttpCounters).
void http_series(std::ostringstream& os, const HttpCounters& h) {
  const SeriesWriter w{os};
  auto counter = [&](const char* name, const char* help, uint64_t v) { w.counter(name, help, v); };
  auto gauge = [&](const char* name, const char* help, double v) { w.gauge(name, help, v); };
  metric(os, "chunkfuse_http_responses_total", "counter", "HTTP responses by status class.");
  os << "chunkfuse_http_responses_total{code=\"2xx\"} " << h.responses_2xx << '\n';
  os << "chunkfuse_http_responses_total{code=\"4xx\"} " << h.responses_4xx << '\n';
  os << "chunkfuse_http_responses_total{code=\"5xx\"} " << h.responses_5xx << '\n';
  counter("chunkfuse_http_streams_cancelled_total", "Streams whose client disconnected mid-answer.", h.streams_cancelled);
  counter("chunkfuse_http_unauthorized_total", "Requests refused 401 (missing or wrong API key).", h.unauthorized);
  counter("chunkfuse_http_connections_refused_total", "Connections answered 503 at the open-connection cap.",
          h.connections_refused);
  counter("chunkfuse_http_connection_timeouts_total",
          "Connections closed because a request did not arrive in time (or its headers grew past the budget).",
          h.connection_timeouts);
  gauge("chunkfuse_http_connections_open", "Open HTTP connections.", static_cast<double>(h.connections_open));
  counter("chunkfuse_knowledge_background_failures_total",
          "Knowledge-base saves, registrations and cache drops that failed in the background (logged; retried).",
          h.knowledge_failures);
  gauge("chunkfuse_chunk_texts_registering", "POST /v1/chunks texts in flight, every key together.",
        static_cast<double>(h.chunk_texts_in_flight));
  counter("chunkfuse_chunk_posts_refused_total",
          "POST /v1/chunks answered 429: the key had --max-key-chunk-texts texts registering already.",
          h.chunk_posts_refused);
}

}  // namespace

std::string prometheus_text(const EngineMetrics& m, const HttpCounters& h, bool cache_use) {
  std::ostringstream os;
  const SeriesWriter w{os};
  auto counter = [&](const char* name, const char* help, uint64_t v) { w.counter(name, help, v); };
  auto gauge = [&](const char* name, const char* help, double v) { w.gauge(name, help, v); };
  counter("chunkfuse_requests_total", "Completion requests the engine accepted.", m.requests);
  counter("chunkfuse_request_errors_total", "Completion requests the engine refused or failed.", m.errors);
  counter("chunkfuse_requests_cancelled_total", "Requests cancelled because the client went away.", m.cancelled);
  counter("chunkfuse_prompt_tokens_total", "Prompt tokens of all requests.", m.prompt_tokens);
  counter("chunkfuse_completion_tokens_total", "Generated tokens.", m.completion_tokens);
  counter("chunkfuse_background_tasks_total",
          "Idle-time work done: CRAFT prefixes promoted, chunk caches a request left cold filled (one each).",
          m.background_tasks);
  gauge("chunkfuse_queue_length", "Requests waiting to be scheduled.", static_cast<double>(m.queue_length));
  gauge("chunkfuse_running_requests", "Requests prefilling or decoding.", static_cast<double>(m.running));
  counter("chunkfuse_decode_steps_total", "Batched decode passes.", m.decode_steps);
  gauge("chunkfuse_kv_reserved_bytes", "K/V reserved by running requests (prompt + max_tokens each).",
        static_cast<double>(m.kv_reserved_bytes));
  gauge("chunkfuse_kv_budget_bytes", "serve --kv-budget (0: unbounded).", static_cast<double>(m.kv_budget_bytes));
  counter("chunkfuse_prefill_pieces_total",
          "Pauses of long forward passes for the running requests' decode steps (serve --prefill-chunk).",
          m.prefill_pieces);
  gauge("chunkfuse_prefill_piece_rows",
        "Rows of the latest prefill piece: --prefill-chunk, or fewer beside streaming answers (--itl-target-ms).",
        static_cast<double>(m.prefill_piece_rows));
  if (cache_use) {  // left out under --isolate-keys (server.h)
    counter("chunkfuse_prefilled_tokens_total", "Prompt tokens that went through the forward pass.", m.prefilled_tokens);
    counter("chunkfuse_prefix_hit_tokens_total", "Prompt tokens served from the prefix cache.", m.prefix_hit_tokens);
    counter("chunkfuse_cached_tokens_total",
            "Prompt tokens whose K/V was reused: prefix-cache hits and stored chunk tokens not recomputed.",
            m.cached_tokens);
    counter("chunkfuse_chunk_hits_total", "Chunks whose cache was found in the store.", m.chunk_hits);
    counter("chunkfuse_chunk_misses_total", "Chunks whose cache had to be computed.", m.chunk_misses);
    const uint64_t chunks = m.chunk_hits + m.chunk_misses;
    gauge("chunkfuse_chunk_hit_ratio", "chunk_hits / (chunk_hits + chunk_misses) since start.",
          chunks ? static_cast<double>(m.chunk_hits) / static_cast<double>(chunks) : 0.0);
    gauge("chunkfuse_prefix_hit_ratio", "prefix_hit_tokens / prompt_tokens since start.",
          m.prompt_tokens ? static_cast<double>(m.prefix_hit_tokens) / static_cast<double>(m.prompt_tokens) : 0.0);
    metric(os, "chunkfuse_store_bytes", "gauge", "Chunk-cache store bytes per tier.");
    os << "chunkfuse_store_bytes{tier=\"memory\"} " << m.store_memory_bytes << '\n';
    os << "chunkfuse_store_bytes{tier=\"disk\"} " << m.store_disk_bytes << '\n';
    gauge("chunkfuse_prefix_cache_bytes", "K/V bytes held by the prefix cache.", static_cast<double>(m.prefix_cache_bytes));
    gauge("chunkfuse_kv_cached_bytes", "Cached K/V under --kv-budget: prefix cache and chunk store memory tier.",
          static_cast<double>(m.kv_cached_bytes));
    counter("chunkfuse_kv_admission_evicted_bytes_total",
            "Cached K/V bytes the caches gave back (evicted, the memory tier demoting to disk) to admit requests.",
            m.kv_admission_evicted_bytes);
    gauge("chunkfuse_conversations_kept", "Conversations whose last turn is kept.", static_cast<double>(m.conversations));
    gauge("chunkfuse_conversation_bytes", "Accounted bytes of the kept conversation turns (--conversation-budget).",
          static_cast<double>(m.conversation_bytes));
    os << store_metrics_text(m.store);
  }

  // TTFT in seconds, Prometheus' base unit; the engine keeps milliseconds.
  metric(os, "chunkfuse_ttft_seconds", "histogram", "Time to first token, queueing included.");
  const size_t n_bounds = m.ttft_bucket_bounds_ms.size();
  for (size_t i = 0; i < n_bounds && i < m.ttft_bucket_counts.size(); ++i)
    os << "chunkfuse_ttft_seconds_bucket{le=\"" << num(m.ttft_bucket_bounds_ms[i] / 1000.0) << "\"} "
       << m.ttft_bucket_counts[i] << '\n';
  const uint64_t inf_count = m.ttft_bucket_counts.size() > n_bounds ? m.ttft_bucket_counts[n_bounds] : m.ttft_count;
  os << "chunkfuse_ttft_seconds_bucket{le=\"+Inf\"} " << inf_count << '\n';
  os << "chunkfuse_ttft_seconds_sum " << num(m.ttft_sum_ms / 1000.0) << '\n';
  os << "chunkfuse_ttft_seconds_count " << m.ttft_count << '\n';

  http_series(os, h);
  return os.str();
}

}  // namespace api
}  // namespace cf

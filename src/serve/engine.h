// The serving engine behind `chunkfuse serve` (issue 5): one model, one chunk store, one
// prefix cache, CRAFT, and a scheduler thread. The HTTP layer (server.cpp) turns requests
// into CompletionRequest and calls Engine::complete from its connection threads; the
// engine queues them fairly (FIFO), starts loading their chunk caches while they wait,
// prefills one at a time and batches the decode steps of all running requests.
//
// Prompt layout of a RAG request (docs/ARCHITECTURE.md): S = the chat template up to the last user
// message's content (system message and earlier turns included), then one chunk per
// document, then U = the last user message and the template's assistant header. Without
// documents the whole rendered prompt is S + U. Completions (`prompt`) use no template.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kv/chunk_store.h"
#include "model/chat_template.h"
#include "serve/conversation_memory.h"
#include "serve/disk_budget.h"
#include "serve/busy_gate.h"

namespace cf {

class Tokenizer;
struct FusionTrace;  // serve/fusion_trace.h

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

struct FusionSpec {
  std::string method = "full";  // full | reuse | random | epic | cacheblend | prophet | fusionrag | cachecraft | qcfuse
  double ratio = 0.15;
  double quality = 0;           // method auto: the target in (0, 1] (fusion/auto_quality.h); else 0
  bool reorder = false;         // CRAFT reordering (can change answers: off by default)
  std::string conversation_id;  // CRAFT conversation-scoped dedup; empty: none
  bool prefix_cache = true;     // use the shared exact prefix cache
  nlohmann::json options = nlohmann::json::object();  // the method's options (Selector::configure)
  std::string chunk_context;    // alone | prefixed (kv/chunk_key.h); empty: EngineOptions's default
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
  std::vector<std::string> stop;
  std::string model;  // echoed back
  std::optional<InlinePassages> inline_passages;  // never from the API: set by passage matching
};

struct CompletionTimings {
  double queue_ms = 0, lookup_ms = 0, load_ms = 0, selection_ms = 0, recompute_ms = 0;
  double ttft_ms = 0;    // from arrival (queue included) to the first token chosen
  double decode_ms = 0;
};

struct CompletionResult {
  std::string text;
  std::string finish_reason;  // "stop" | "length" (a cancelled request: "stop", cancelled set)
  bool cancelled = false;     // on_text returned false
  size_t history_tokens = 0;  // tokens of earlier turns of the conversation at the start of S
  size_t prompt_tokens = 0, completion_tokens = 0;
  size_t prefix_hit_tokens = 0;      // served from the prefix cache
  size_t chunk_hits = 0, chunk_misses = 0;
  size_t recomputed_tokens = 0;      // context tokens recomputed by fusion
  size_t prefilled_tokens = 0;       // tokens that went through the forward pass for the prompt
  std::vector<std::string> chunk_order;  // chunk ids in prompt order (after CRAFT)
  size_t deduped_chunks = 0;
  CompletionTimings timings;
  std::shared_ptr<const FusionTrace> trace;  // positions and selector facts, for the web page's details
  nlohmann::json passages;           // passage matching's report (null: not matched)
  nlohmann::json auto_choice;        // method auto: what the policy chose (AutoDecision::to_json); else null
  nlohmann::json to_json() const;    // the "chunkfuse" extension object of a response
};

struct ChunkInfo {
  std::string id;
  size_t n_tokens = 0;
  bool cached = false;  // its cache is in the store
  std::string text;
};

struct EngineOptions {
  std::string model_path;
  int threads = 0;                     // 0: all cores
  std::string cache_dir;               // chunk store directory; empty: <cache_root>/serve-store
  size_t chunk_memory_bytes = size_t{1} << 30;
  std::string chunk_eviction = "cachecraft";  // memory-tier policy: lru | cachecraft (f_r, Cache-Craft §3.3)
  // Cache files past this many bytes are deleted; 0: unbounded; kDiskBudgetDefault: the default
  // for the store's file system, computed at start-up (serve/disk_budget.h) and kept here.
  size_t chunk_disk_bytes = kDiskBudgetDefault;
  size_t max_chunk_entries = 0;               // Cache-Craft's N x M entry budget; 0: unbounded
  std::string store_key_file;                 // HMAC key for cache entries (kv/entry_auth.h); empty: none
  size_t prefix_cache_bytes = size_t{256} << 20;
  size_t conversation_bytes = kDefaultConversationBytes;  // kept conversation turns; 0: none kept
  size_t max_prompt_tokens = 0;        // 0: the model's context length
  size_t max_queue = 64;               // waiting requests; more gets 503
  size_t max_tokenizing = 0;           // requests tokenizing at once (0: 2 x hardware threads)
  size_t tokenize_wait_ms = 2000;      // the wait for a tokenizing slot, then 503 server_busy
  size_t max_batch = 8;                // requests decoding together
  size_t max_documents = 64;
  std::string default_method = "full";
  double default_ratio = 0.15;         // serve --ratio: fusion.ratio of requests that name none
  ChunkContext default_chunk_context = ChunkContext::alone;  // serve --chunk-context
  std::optional<RemoteTierOptions> remote;  // shared chunk-cache tier on Redis (issue 13)
};

struct EngineMetrics {
  uint64_t requests = 0, errors = 0, cancelled = 0;
  size_t queue_length = 0, running = 0;
  std::vector<double> ttft_bucket_bounds_ms;  // histogram upper bounds
  std::vector<uint64_t> ttft_bucket_counts;   // cumulative, Prometheus style; last = +Inf
  double ttft_sum_ms = 0;
  uint64_t ttft_count = 0;
  uint64_t prompt_tokens = 0, completion_tokens = 0, prefilled_tokens = 0, prefix_hit_tokens = 0;
  uint64_t chunk_hits = 0, chunk_misses = 0;
  uint64_t decode_steps = 0, decode_rows = 0;  // batched decode passes and the sequences in them
  uint64_t background_tasks = 0;  // idle-time work done (CRAFT prefixes promoted under fusion)
  size_t store_memory_bytes = 0, store_disk_bytes = 0, prefix_cache_bytes = 0;
  size_t conversations = 0, conversation_bytes = 0;  // kept turns and their accounted bytes
  ChunkStoreStats store;  // the chunk store's counters, remote tier included (store_metrics.h)
};

class Engine {
 public:
  explicit Engine(EngineOptions opt);  // loads the model; throws std::runtime_error
  ~Engine();                           // stops the scheduler; waiting requests get 503

  // Validates, queues, runs; blocks the calling thread until done. on_text streams the
  // answer as it becomes final; returning false cancels (client gone): the request's slot
  // is freed at the next step and RequestError is not thrown, the partial result returned.
  CompletionResult complete(const CompletionRequest& req,
                            const std::function<bool(std::string_view)>& on_text = {});

  // Registers passages (tokenized alone, cache precomputed into the store); returns ids.
  std::vector<ChunkInfo> register_chunks(const std::vector<std::string>& texts);
  std::optional<ChunkInfo> chunk(const std::string& id) const;
  bool remove_chunk(const std::string& id);
  const ChunkStore& chunk_store() const;  // for listings (serve/chunk_cache_state.h)
  // Registered chunk texts, and a counter that changes whenever they do (passage matching).
  std::vector<std::string> registered_texts() const;
  uint64_t registry_version() const;

  EngineMetrics metrics() const;
  std::string model_name() const;  // GGUF general.name or the file stem
  const EngineOptions& options() const;     // max_prompt_tokens resolved (never 0)
  const Tokenizer& tokenizer() const;       // for request_limits' byte bound
  // Held by whoever turns a request's text into tokens (serve/busy_gate.h).
  BusyGate& tokenize_gate() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cf

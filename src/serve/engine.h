// The serving engine behind `chunkfuse serve` (issue 5): one model, one chunk store, one
// prefix cache, CRAFT, and a scheduler thread. The HTTP layer (server.cpp) turns requests
// into CompletionRequest and calls Engine::complete from its connection threads; the
// engine queues them fairly (FIFO), starts loading their chunk caches while they wait,
// prefills one at a time and batches the decode steps of all running requests.
//
// The request and its answer (CompletionRequest, CompletionResult, RequestError) are in
// serve/request.h, which the layers around the engine include instead of this file.
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

#include "fusion/fusion_options.h"
#include "kv/chunk_store.h"
#include "serve/busy_gate.h"
#include "serve/conversation_memory.h"
#include "serve/disk_budget.h"
#include "serve/kv_budget.h"
#include "serve/request.h"
#include "serve/request_metrics.h"
#include "serve/scheduler.h"

namespace cf {

class Tokenizer;
class ChunkRegistry;

struct EngineOptions {
  std::string model_path;
  int threads = 0;                     // 0: all cores
  std::string cache_dir;               // chunk store directory; empty: <cache_root>/serve-store
  // The chunk store's memory tier at most (serve --mem-budget) and the prefix cache's
  // (--prefix-cache-budget), both inside kv_budget_bytes; kKvBudgetDefault: all of the budget,
  // or 1 GiB and 256 MiB with an unbounded budget (serve/kv_budget.h).
  size_t chunk_memory_bytes = kKvBudgetDefault;
  std::string chunk_eviction = "cachecraft";  // memory-tier policy: lru | cachecraft (f_r, Cache-Craft §3.3)
  // Cache files past this many bytes are deleted; 0: unbounded; kDiskBudgetDefault: the default
  // for the store's file system, computed at start-up (serve/disk_budget.h) and kept here.
  size_t chunk_disk_bytes = kDiskBudgetDefault;
  size_t max_chunk_entries = 0;               // Cache-Craft's N x M entry budget; 0: unbounded
  std::string store_key_file;                 // HMAC key for cache entries (kv/entry_auth.h); empty: none
  size_t prefix_cache_bytes = kKvBudgetDefault;
  size_t conversation_bytes = kDefaultConversationBytes;  // kept conversation turns; 0: none kept
  size_t max_prompt_tokens = 0;        // 0: the model's context length
  size_t max_queue = 64;               // waiting requests; more gets 503
  size_t max_tokenizing = 0;           // requests tokenizing at once (0: 2 x hardware threads)
  size_t tokenize_wait_ms = 2000;      // the wait for a tokenizing slot, then 503 server_busy
  size_t max_batch = 8;                // requests decoding together
  // Prefill rows between two decode steps of the running requests (serve --prefill-chunk;
  // 0: whole prefills; issue 58 item 1).
  size_t prefill_chunk = SchedulerOptions::kDefaultPrefillChunk;
  // The gap between two tokens of a running answer that a prefill piece is sized for
  // (serve --itl-target-ms; serve/piece_sizer.h): kAuto, 0 (off: pieces of prefill_chunk), ms.
  double itl_target_ms = PrefillPieceSizer::kAuto;
  // Which waiting request prefills next (serve --schedule: fifo | priority | shortest) and the
  // wait after which one goes first whatever the order (serve --max-wait-ms; issue 58 item 2).
  std::string schedule = "fifo";
  size_t max_wait_ms = 30000;
  // One K/V budget (serve --kv-budget; issue 58 item 3, serve/kv_budget.h) for the running
  // requests' reservations (prompt + max_tokens each) and the cached K/V (the prefix cache, the
  // chunk store's memory tier). The caches use what the reservations leave free and give it back,
  // in their eviction order, when a request needs it; only past the reservations does a
  // request wait in the queue. kKvBudgetDefault: a quarter of the machine's memory, resolved at
  // start-up; 0: unbounded.
  size_t kv_budget_bytes = kKvBudgetDefault;
  size_t max_documents = 64;
  // Texts one POST /v1/chunks may register (serve --max-chunk-texts; each costs a prefill of
  // its own, issue 59): more is 413 before any is tokenized.
  size_t max_chunk_texts = 64;
  // Texts and tokens of the registered chunks together (serve --registry-budget, issue 59; the
  // knowledge base registers its chunks too): a registration past it is 409. 0: unbounded.
  size_t registry_budget_bytes = size_t{512} << 20;
  size_t max_variants = 16;            // Cache-Craft variants per chunk a request may keep (PlanLimits)
  // The fusion of requests that name none: serve --method, --ratio, --chunk-context (a
  // request's fusion fields override each; checked at start-up).
  FusionOptions default_fusion;
  // The share of served fused answers checked against full prefill when idle (serve
  // --self-check, whose default is 0.2; serve/self_check.h). 0: off, the engine's default.
  double self_check_share = 0;
  std::optional<RemoteTierOptions> remote;  // shared chunk-cache tier on Redis (issue 13)
};

class Engine {
 public:
  explicit Engine(EngineOptions opt);  // loads the model; throws std::runtime_error
  ~Engine();                           // stops the scheduler; waiting requests get 503

  // Validates, queues, runs; blocks the calling thread until done. on_text streams the
  // answer as it becomes final; returning false cancels (client gone): the request's slot
  // is freed at the next step and RequestError is not thrown, the partial result returned.
  // client_gone (optional) is asked on the calling thread while the request waits, prefills
  // or decodes (every Scheduler::kCancelPollMs); once it answers true the work stops within
  // one step and RequestError 499 is thrown (issue 58 item 4).
  CompletionResult complete(const CompletionRequest& req,
                            const std::function<bool(std::string_view)>& on_text = {},
                            const std::function<bool()>& client_gone = {});

  // Registers passages (tokenized alone, cache precomputed into the store); returns ids.
  // client_gone (optional) is asked between texts: once true, RequestError 499 and the rest
  // are not computed (those done stay in the store, unregistered).
  std::vector<ChunkInfo> register_chunks(const std::vector<std::string>& texts,
                                         const std::function<bool()>& client_gone = {});
  std::optional<ChunkInfo> chunk(const std::string& id) const;
  bool remove_chunk(const std::string& id);
  const ChunkStore& chunk_store() const;  // for listings (serve/chunk_cache_state.h)
  // The registered chunks' texts and version (passage matching reads them).
  const ChunkRegistry& registry() const;

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

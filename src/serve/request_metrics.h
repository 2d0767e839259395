// The engine's request counters and TTFT histogram (GET /metrics), recorded once per completion
// (issue 25 split them out of the engine). The gauges of EngineMetrics (queue, running, decode
// passes, store) are read from their owners when a snapshot is taken. Thread-safe.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kv/chunk_store.h"
#include "serve/request.h"
#include "serve/self_check_ledger.h"

namespace cf {

// What GET /metrics reports (serve/api_json.h prometheus_text).
struct EngineMetrics {
  uint64_t requests = 0, errors = 0, cancelled = 0;
  size_t queue_length = 0, running = 0;
  std::vector<double> ttft_bucket_bounds_ms;  // histogram upper bounds
  std::vector<uint64_t> ttft_bucket_counts;   // cumulative, Prometheus style; last = +Inf
  double ttft_sum_ms = 0;
  uint64_t ttft_count = 0;
  std::vector<double> itl_bucket_bounds_ms;  // inter-token latency: the gap before each token after the first
  std::vector<uint64_t> itl_bucket_counts;   // cumulative; last = +Inf
  double itl_sum_ms = 0;
  uint64_t itl_count = 0;
  uint64_t prompt_tokens = 0, completion_tokens = 0, prefilled_tokens = 0, prefix_hit_tokens = 0;
  uint64_t cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens summed (token_accounting.h)
  uint64_t chunk_hits = 0, chunk_misses = 0;
  uint64_t decode_steps = 0, decode_rows = 0;  // batched decode passes and the sequences in them
  uint64_t prefill_pieces = 0;  // pauses of split passes (chunked prefill, Scheduler::prefill_pieces)
  size_t prefill_piece_rows = 0;  // rows of the latest piece asked for (Scheduler::last_piece_rows)
  size_t kv_reserved_bytes = 0, kv_budget_bytes = 0;  // running requests' K/V reservations, the one budget (0: none)
  size_t kv_cached_bytes = 0;              // cached K/V under that budget: prefix cache + chunk store memory tier
  uint64_t kv_admission_evicted_bytes = 0;  // cached K/V the caches gave back to admit requests (serve/kv_budget.h)
  uint64_t background_tasks = 0;  // idle-time work done (CRAFT prefixes promoted, cold chunk caches filled)
  size_t store_memory_bytes = 0, store_disk_bytes = 0, prefix_cache_bytes = 0;
  size_t conversations = 0, conversation_bytes = 0;  // kept turns and their accounted bytes
  ChunkStoreStats store;  // the chunk store's counters, remote tier included (store_metrics.h)
  SelfCheckSnapshot self_check;  // serve --self-check's ledger (self_check.h)
};

class RequestMetrics {
 public:
  RequestMetrics();
  void record(const CompletionResult& r);  // a completion answered (cancelled ones included)
  void record_error();                     // a completion refused or failed
  void record_cancelled();                 // a completion stopped because its client went away
  void record_token_gaps(const std::vector<float>& gaps_ms);  // one completion's inter-token gaps
  void set_prefix_cache_bytes(size_t bytes);
  EngineMetrics snapshot() const;          // counters, histogram and prefix_cache_bytes

 private:
  mutable std::mutex mu_;
  EngineMetrics m_;
};

}  // namespace cf

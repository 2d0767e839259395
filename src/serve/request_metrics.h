// The engine's request counters and TTFT histogram (GET /metrics), recorded once per completion
// (issue 25 split them out of the engine). The gauges of EngineMetrics (queue, running, decode
// passes, store) are read from their owners when a snapshot is taken. Thread-safe.
#pragma once
#include <cstddef>
#include <mutex>

#include "serve/engine.h"

namespace cf {

class RequestMetrics {
 public:
  RequestMetrics();
  void record(const CompletionResult& r);  // a completion answered (cancelled ones included)
  void record_error();                     // a completion refused or failed
  void set_prefix_cache_bytes(size_t bytes);
  EngineMetrics snapshot() const;          // counters, histogram and prefix_cache_bytes

 private:
  mutable std::mutex mu_;
  EngineMetrics m_;
};

}  // namespace cf

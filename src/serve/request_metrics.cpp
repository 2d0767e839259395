#include "serve/request_metrics.h"

#include <vector>

namespace cf {
namespace {
const std::vector<double> kTtftBucketsMs = {50, 100, 250, 500, 1000, 2500, 5000, 10000};
}  // namespace

RequestMetrics::RequestMetrics() {
  m_.ttft_bucket_bounds_ms = kTtftBucketsMs;
  m_.ttft_bucket_counts.assign(kTtftBucketsMs.size() + 1, 0);
}

void RequestMetrics::record(const CompletionResult& r) {
  std::lock_guard<std::mutex> lock(mu_);
  ++m_.requests;
  if (r.cancelled) ++m_.cancelled;
  const double t = r.timings.ttft_ms;
  for (size_t b = 0; b < kTtftBucketsMs.size(); ++b)
    if (t <= kTtftBucketsMs[b]) ++m_.ttft_bucket_counts[b];
  ++m_.ttft_bucket_counts.back();
  m_.ttft_sum_ms += t;
  ++m_.ttft_count;
  m_.prompt_tokens += r.prompt_tokens;
  m_.completion_tokens += r.completion_tokens;
  m_.prefilled_tokens += r.prefilled_tokens;
  m_.prefix_hit_tokens += r.prefix_hit_tokens;
  m_.chunk_hits += r.chunk_hits;
  m_.chunk_misses += r.chunk_misses;
}

void RequestMetrics::record_error() {
  std::lock_guard<std::mutex> lock(mu_);
  ++m_.errors;
}

void RequestMetrics::set_prefix_cache_bytes(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.prefix_cache_bytes = bytes;
}

EngineMetrics RequestMetrics::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return m_;
}

}  // namespace cf

#include "serve/request_metrics.h"

#include <vector>

namespace cf {
namespace {
const std::vector<double> kTtftBucketsMs = {50, 100, 250, 500, 1000, 2500, 5000, 10000};
// vLLM's inter_token_latency_seconds buckets (10 ms .. 80 s), in ms.
const std::vector<double> kItlBucketsMs = {10,  25,   50,   75,   100,  150,   200,   300,   400,   500,
                                           750, 1000, 2500, 5000, 7500, 10000, 20000, 40000, 80000};

void add_to_histogram(const std::vector<double>& bounds, std::vector<uint64_t>& counts, double v) {
  for (size_t b = 0; b < bounds.size(); ++b)
    if (v <= bounds[b]) ++counts[b];
  ++counts.back();
}
}  // namespace

RequestMetrics::RequestMetrics() {
  m_.ttft_bucket_bounds_ms = kTtftBucketsMs;
  m_.ttft_bucket_counts.assign(kTtftBucketsMs.size() + 1, 0);
  m_.itl_bucket_bounds_ms = kItlBucketsMs;
  m_.itl_bucket_counts.assign(kItlBucketsMs.size() + 1, 0);
}

void RequestMetrics::record(const CompletionResult& r) {
  std::lock_guard<std::mutex> lock(mu_);
  ++m_.requests;
  if (r.cancelled) ++m_.cancelled;
  const double t = r.timings.ttft_ms;
  add_to_histogram(kTtftBucketsMs, m_.ttft_bucket_counts, t);
  m_.ttft_sum_ms += t;
  ++m_.ttft_count;
  m_.prompt_tokens += r.prompt_tokens;
  m_.completion_tokens += r.completion_tokens;
  m_.prefilled_tokens += r.prefilled_tokens;
  m_.prefix_hit_tokens += r.prefix_hit_tokens;
  m_.cached_tokens += r.cached_tokens;
  m_.chunk_hits += r.chunk_hits;
  m_.chunk_misses += r.chunk_misses;
}

void RequestMetrics::record_error() {
  std::lock_guard<std::mutex> lock(mu_);
  ++m_.errors;
}

void RequestMetrics::record_cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  ++m_.requests;
  ++m_.cancelled;
}

void RequestMetrics::record_token_gaps(const std::vector<float>& gaps_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  for (float g : gaps_ms) {
    add_to_histogram(kItlBucketsMs, m_.itl_bucket_counts, g);
    m_.itl_sum_ms += g;
  }
  m_.itl_count += gaps_ms.size();
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

// GET /metrics under vLLM's names (serve/vllm_metrics.h, issue 58 item 5): what a vLLM
// dashboard scrapes must be there, with the model label, and mean what vLLM means.
#include <gtest/gtest.h>

#include <string>

#include "serve/vllm_metrics.h"

namespace cf {
namespace {

EngineMetrics sample() {
  EngineMetrics m;
  m.running = 3;
  m.queue_length = 5;
  m.prompt_tokens = 1000;
  m.prefilled_tokens = 150;
  m.cached_tokens = 800;  // reused K/V; the other 50 not prefilled were chunks computed for their request
  m.completion_tokens = 42;
  m.ttft_bucket_bounds_ms = {100, 1000};
  m.ttft_bucket_counts = {1, 3, 4};
  m.ttft_sum_ms = 2500;
  m.ttft_count = 4;
  return m;
}

bool has(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

TEST(VllmMetrics, NamesLabelsAndMeanings) {
  const std::string t = vllm_metrics_text(sample(), "qwen", true);
  EXPECT_TRUE(has(t, "vllm:num_requests_running{model_name=\"qwen\"} 3")) << t;
  EXPECT_TRUE(has(t, "vllm:num_requests_waiting{model_name=\"qwen\"} 5")) << t;
  EXPECT_TRUE(has(t, "vllm:prompt_tokens_total{model_name=\"qwen\"} 1000")) << t;
  EXPECT_TRUE(has(t, "vllm:generation_tokens_total{model_name=\"qwen\"} 42")) << t;
  EXPECT_TRUE(has(t, "vllm:prefix_cache_queries_total{model_name=\"qwen\"} 1000")) << t;
  EXPECT_TRUE(has(t, "vllm:prefix_cache_hits_total{model_name=\"qwen\"} 800")) << t;
  EXPECT_TRUE(has(t, "# TYPE vllm:time_to_first_token_seconds histogram")) << t;
  EXPECT_TRUE(has(t, "vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\",le=\"0.1\"} 1")) << t;
  EXPECT_TRUE(has(t, "vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\",le=\"1\"} 3")) << t;
  EXPECT_TRUE(has(t, "vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\",le=\"+Inf\"} 4")) << t;
  EXPECT_TRUE(has(t, "vllm:time_to_first_token_seconds_sum{model_name=\"qwen\"} 2.5")) << t;
  EXPECT_TRUE(has(t, "vllm:time_to_first_token_seconds_count{model_name=\"qwen\"} 4")) << t;
}

TEST(VllmMetrics, IsolatedKeysHideCacheUseAndLabelsAreEscaped) {
  const std::string t = vllm_metrics_text(sample(), "a\"b\\c\nd", false);
  EXPECT_EQ(t.find("prefix_cache"), std::string::npos) << t;  // cache use tells one key about another's
  EXPECT_TRUE(has(t, "vllm:num_requests_running{model_name=\"a\\\"b\\\\c\\nd\"} 3")) << t;
}

// One K/V budget (serve/kv_budget.h): the share in use is the reservations plus the cached K/V;
// under --isolate-keys, whose cache series are left out, the reservations alone.
TEST(VllmMetrics, KvCacheUsageCountsReservationsAndCachedKv) {
  EngineMetrics m = sample();
  m.kv_budget_bytes = 1000;
  m.kv_reserved_bytes = 300;
  m.kv_cached_bytes = 450;
  EXPECT_TRUE(has(vllm_metrics_text(m, "qwen", true), "vllm:kv_cache_usage_perc{model_name=\"qwen\"} 0.75"));
  EXPECT_TRUE(has(vllm_metrics_text(m, "qwen", false), "vllm:kv_cache_usage_perc{model_name=\"qwen\"} 0.3"));
  m.kv_budget_bytes = 0;  // unbounded
  EXPECT_TRUE(has(vllm_metrics_text(m, "qwen", true), "vllm:kv_cache_usage_perc{model_name=\"qwen\"} 0"));
}

}  // namespace
}  // namespace cf

// The engine's counters under the names vLLM gives them (issue 58 item 5), so dashboards and
// autoscalers that already scrape vLLM read chunkfuse unchanged: appended to GET /metrics
// beside the chunkfuse_* series, each with vLLM's model_name label.
//
// Mapping (vLLM V1 names):
//   vllm:num_requests_running / _waiting   EngineMetrics::running / queue_length
//   vllm:prompt_tokens_total               prompt tokens of answered requests
//   vllm:generation_tokens_total           generated tokens
//   vllm:prefix_cache_queries_total        prompt tokens looked up (every prompt token)
//   vllm:prefix_cache_hits_total           prompt tokens whose K/V was reused: prefix-cache
//                                          hits and stored chunks' tokens not recomputed
//                                          (usage.prompt_tokens_details.cached_tokens summed)
//   vllm:time_to_first_token_seconds       the TTFT histogram, queueing included
//   vllm:inter_token_latency_seconds       the gaps between a request's tokens
//   vllm:kv_cache_usage_perc               (reservations + cached K/V) / serve --kv-budget
//                                          (serve/kv_budget.h; 0 without a budget; under
//                                          --isolate-keys the reservations alone, as the cache
//                                          series are left out)
#pragma once
#include <string>

#include "serve/request_metrics.h"

namespace cf {

// `cache_use` false (--isolate-keys): the prefix-cache series are left out, as chunkfuse's are.
std::string vllm_metrics_text(const EngineMetrics& m, const std::string& model_name, bool cache_use);
// A label value in Prometheus' text format: backslash, quote and newline escaped (every
// labelled series of GET /metrics: these and the self-check's, serve/self_check_ledger.cpp).
std::string prometheus_label_value(const std::string& v);

}  // namespace cf

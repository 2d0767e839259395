#include "serve/vllm_metrics.h"

#include <sstream>

namespace cf {
std::string prometheus_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

namespace {

std::string number(double x) {
  std::ostringstream os;
  os.precision(15);
  os << x;
  return os.str();
}

}  // namespace

std::string vllm_metrics_text(const EngineMetrics& m, const std::string& model_name, bool cache_use) {
  std::ostringstream os;
  const std::string label = "model_name=\"" + prometheus_label_value(model_name) + "\"";
  auto series = [&](const char* name, const char* type, const char* help, double v) {
    os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
       << name << '{' << label << "} " << number(v) << '\n';
  };
  series("vllm:num_requests_running", "gauge", "Requests prefilling or decoding.", static_cast<double>(m.running));
  series("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", static_cast<double>(m.queue_length));
  series("vllm:kv_cache_usage_perc", "gauge",
         "Share of the K/V budget (serve --kv-budget) in use: running requests' reservations plus the cached K/V "
         "(prefix cache, chunk store memory tier; reservations alone under --isolate-keys); 0 without a budget.",
         m.kv_budget_bytes ? static_cast<double>(m.kv_reserved_bytes + (cache_use ? m.kv_cached_bytes : 0)) /
                                 static_cast<double>(m.kv_budget_bytes)
                           : 0.0);
  series("vllm:prompt_tokens_total", "counter", "Prompt tokens of answered requests.", static_cast<double>(m.prompt_tokens));
  series("vllm:generation_tokens_total", "counter", "Generated tokens.", static_cast<double>(m.completion_tokens));
  if (cache_use) {
    series("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the caches.",
           static_cast<double>(m.prompt_tokens));
    series("vllm:prefix_cache_hits_total", "counter",
           "Prompt tokens whose K/V was reused: prefix-cache hits and stored chunk tokens not recomputed.",
           static_cast<double>(m.cached_tokens));
  }
  auto histogram = [&](const char* name, const char* help, const std::vector<double>& bounds_ms,
                       const std::vector<uint64_t>& counts, double sum_ms, uint64_t count) {
    os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
    for (size_t i = 0; i < bounds_ms.size() && i < counts.size(); ++i)
      os << name << "_bucket{" << label << ",le=\"" << number(bounds_ms[i] / 1000.0) << "\"} " << counts[i] << '\n';
    const uint64_t inf_count = counts.size() > bounds_ms.size() ? counts[bounds_ms.size()] : count;
    os << name << "_bucket{" << label << ",le=\"+Inf\"} " << inf_count << '\n';
    os << name << "_sum{" << label << "} " << number(sum_ms / 1000.0) << '\n';
    os << name << "_count{" << label << "} " << count << '\n';
  };
  histogram("vllm:time_to_first_token_seconds", "Time to first token, queueing included.", m.ttft_bucket_bounds_ms,
            m.ttft_bucket_counts, m.ttft_sum_ms, m.ttft_count);
  histogram("vllm:inter_token_latency_seconds", "Time between two consecutive generated tokens of a request.",
            m.itl_bucket_bounds_ms, m.itl_bucket_counts, m.itl_sum_ms, m.itl_count);
  return os.str();
}

}  // namespace cf

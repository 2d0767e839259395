// The chunk store's and remote tier's lines on GET /metrics (issue 13).
#include <gtest/gtest.h>

#include <string>

#include "serve/api_json.h"
#include "serve/store_metrics.h"

namespace cf {
namespace {

bool has_line(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

TEST(StoreMetrics, TierHitsAndComputesAlwaysRemoteOnlyWithATier) {
  ChunkStoreStats s;
  s.memory_hits = 5;
  s.disk_hits = 2;
  s.remote_hits = 3;
  s.computes = 4;
  s.compute_ms = 1500;
  std::string text = store_metrics_text(s);
  EXPECT_TRUE(has_line(text, "# TYPE chunkfuse_store_computes_total counter"));
  EXPECT_TRUE(has_line(text, "chunkfuse_store_computes_total 4"));
  EXPECT_TRUE(has_line(text, "chunkfuse_store_compute_seconds_total 1.5"));
  EXPECT_TRUE(has_line(text, "chunkfuse_store_hits_total{tier=\"remote\"} 3"));
  EXPECT_EQ(text.find("chunkfuse_remote_"), std::string::npos);

  s.has_remote = true;
  s.remote.hits = 3;
  s.remote.misses = 7;
  s.remote.corrupt = 1;
  s.remote.bytes_read = 123456789;
  s.remote.writes_dropped = 2;
  s.remote.up = true;
  s.remote.reads = 10;
  s.remote.read_ms_sum = 40;
  s.remote.read_ms_buckets.assign(std::size(kRemoteLatencyBoundsMs) + 1, 0);
  s.remote.read_ms_buckets[2] = 6;  // <= 5 ms
  EngineMetrics m;
  m.store = s;
  text = api::prometheus_text(m, api::HttpCounters{});  // appended to the server's text
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_hits_total 3"));
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_misses_total 7"));
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_corrupt_total 1"));
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_read_bytes_total 123456789"));
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_writes_dropped_total 2"));
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_up 1"));
  EXPECT_TRUE(has_line(text, "# TYPE chunkfuse_remote_read_seconds histogram"));
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_read_seconds_bucket{le=\"0.005\"} 6"));
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_read_seconds_bucket{le=\"+Inf\"} 10"));
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_read_seconds_sum 0.04"));
  EXPECT_TRUE(has_line(text, "chunkfuse_remote_read_seconds_count 10"));
}

}  // namespace
}  // namespace cf

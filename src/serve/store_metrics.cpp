#include "serve/store_metrics.h"

#include <cstdio>
#include <iterator>
#include <sstream>

namespace cf {

std::string store_metrics_text(const ChunkStoreStats& s) {
  std::ostringstream os;
  auto head = [&](const char* name, const char* type, const char* help) {
    os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    head(name, type, help);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    os << name << ' ' << buf << '\n';
  };
  one("chunkfuse_store_computes_total", "counter", "Chunk caches this process computed (store misses filled).",
      static_cast<double>(s.computes));
  one("chunkfuse_store_compute_seconds_total", "counter", "Time spent computing those chunk caches.",
      s.compute_ms / 1000.0);
  head("chunkfuse_store_hits_total", "counter", "Chunk-store lookups served, by tier.");
  os << "chunkfuse_store_hits_total{tier=\"memory\"} " << s.memory_hits << '\n';
  os << "chunkfuse_store_hits_total{tier=\"disk\"} " << s.disk_hits << '\n';
  os << "chunkfuse_store_hits_total{tier=\"remote\"} " << s.remote_hits << '\n';
  head("chunkfuse_store_refused_entries_total", "counter",
       "Chunk-cache files refused and moved aside, by reason (damaged, another model or shape, no valid HMAC tag).");
  os << "chunkfuse_store_refused_entries_total{reason=\"damaged\"} "
     << s.corrupt_files - s.foreign_files - s.unauthenticated_files << '\n';
  os << "chunkfuse_store_refused_entries_total{reason=\"foreign\"} " << s.foreign_files << '\n';
  os << "chunkfuse_store_refused_entries_total{reason=\"unauthenticated\"} " << s.unauthenticated_files << '\n';
  if (!s.has_remote) return os.str();

  const RemoteTierStats& r = s.remote;
  auto counter = [&](const char* name, const char* help, uint64_t v) { one(name, "counter", help, static_cast<double>(v)); };
  counter("chunkfuse_remote_hits_total", "Remote-tier reads that returned a verified entry.", r.hits);
  counter("chunkfuse_remote_misses_total", "Remote-tier reads without one (absent, bad, or Redis unreachable).", r.misses);
  counter("chunkfuse_remote_errors_total", "Remote-tier connection failures, timeouts and error replies.", r.errors);
  counter("chunkfuse_remote_corrupt_total", "Remote entries that failed verification: reported, deleted, recomputed.",
          r.corrupt);
  counter("chunkfuse_remote_incomplete_total", "Remote entries with pieces missing (evicted or replaced): deleted.",
          r.incomplete);
  counter("chunkfuse_remote_writes_total", "Entries committed to the remote tier.", r.writes);
  counter("chunkfuse_remote_writes_present_total", "Remote writes skipped: the same bytes were there.", r.writes_present);
  counter("chunkfuse_remote_write_errors_total", "Remote writes that failed (Redis down, out of memory, ...).",
          r.write_errors);
  counter("chunkfuse_remote_writes_dropped_total", "Remote writes dropped: queue full or Redis known down.",
          r.writes_dropped);
  counter("chunkfuse_remote_read_bytes_total", "Compressed bytes read from the remote tier.", r.bytes_read);
  counter("chunkfuse_remote_written_bytes_total", "Compressed bytes written to the remote tier.", r.bytes_written);
  counter("chunkfuse_remote_connects_total", "Connections opened to Redis (reconnects included).", r.connects);
  counter("chunkfuse_remote_connect_failures_total", "Failed connection attempts.", r.connect_failures);
  one("chunkfuse_remote_up", "gauge", "1 if the last remote-tier command succeeded.", r.up ? 1 : 0);
  one("chunkfuse_remote_queue_entries", "gauge", "Remote writes waiting in the queue.", static_cast<double>(r.queue_entries));
  one("chunkfuse_remote_queue_bytes", "gauge", "Bytes of remote writes waiting in the queue.",
      static_cast<double>(r.queue_bytes));
  head("chunkfuse_remote_read_seconds", "histogram", "Remote-tier read latency (manifest, pieces, checks).");
  for (size_t b = 0; b < std::size(kRemoteLatencyBoundsMs) && b < r.read_ms_buckets.size(); ++b)
    os << "chunkfuse_remote_read_seconds_bucket{le=\"" << kRemoteLatencyBoundsMs[b] / 1000.0 << "\"} "
       << r.read_ms_buckets[b] << '\n';
  os << "chunkfuse_remote_read_seconds_bucket{le=\"+Inf\"} " << r.reads << '\n';
  os << "chunkfuse_remote_read_seconds_sum " << r.read_ms_sum / 1000.0 << '\n';
  os << "chunkfuse_remote_read_seconds_count " << r.reads << '\n';
  return os.str();
}

}  // namespace cf

// Prometheus lines for the chunk store's tiers and its remote tier (issue 13), appended to
// GET /metrics by api::prometheus_text.
#pragma once
#include <string>

#include "kv/chunk_store.h"

namespace cf {
// Store hits per tier and computes always; chunkfuse_remote_* only with a remote tier.
std::string store_metrics_text(const ChunkStoreStats& s);
}  // namespace cf

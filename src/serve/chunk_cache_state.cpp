#include "serve/chunk_cache_state.h"

#include "fusion/qcfuse.h"
#include "fusion/select_cachecraft.h"
#include "kv/chunk_store.h"

namespace cf {

nlohmann::json chunk_cache_state(const ChunkStore& store, const std::string& cache_id) {
  const ChunkTiers t = store.tiers(cache_id);
  const size_t variants = cachecraft_variant_count(t.extra);  // Cache-Craft's, indexed by the PIC entry
  const bool anchors = qcfuse::has_stored_anchors(t.extra);
  return {{"memory", t.memory},
          {"disk", t.disk},
          {"remote", t.remote ? nlohmann::json(*t.remote) : nlohmann::json(nullptr)},
          {"variants", variants},
          {"anchors", anchors}};
}

}  // namespace cf

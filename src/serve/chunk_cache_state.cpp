#include "serve/chunk_cache_state.h"

#include "fusion/qcfuse.h"
#include "kv/chunk_store.h"

namespace cf {

nlohmann::json chunk_cache_state(const ChunkStore& store, const std::string& cache_id) {
  const ChunkTiers t = store.tiers(cache_id);
  size_t variants = 0;
  // Cache-Craft's index of a chunk's variants: extra["cachecraft"]["variants"] of its PIC entry.
  if (auto c = t.extra.find("cachecraft"); c != t.extra.end() && c->is_object())
    if (auto v = c->find("variants"); v != c->end() && v->is_array()) variants = v->size();
  const bool anchors = qcfuse::has_stored_anchors(t.extra);
  return {{"memory", t.memory},
          {"disk", t.disk},
          {"remote", t.remote ? nlohmann::json(*t.remote) : nlohmann::json(nullptr)},
          {"variants", variants},
          {"anchors", anchors}};
}

}  // namespace cf

// KeyIsolation: which API key registered which chunk (see key_isolation.h).
#include "serve/key_isolation.h"

namespace cf {

void KeyIsolation::note_registered(size_t tenant, const std::vector<std::string>& ids) {
  std::lock_guard lk(mu_);
  for (const auto& id : ids) owners_.emplace(id, tenant);
}

bool KeyIsolation::owns(size_t tenant, const std::string& id) const {
  std::lock_guard lk(mu_);
  return owners_.count({id, tenant}) != 0;
}

bool KeyIsolation::release(size_t tenant, const std::string& id, bool& was_owner) {
  std::lock_guard lk(mu_);
  was_owner = owners_.erase({id, tenant}) != 0;
  const auto next = owners_.lower_bound({id, 0});
  return was_owner && (next == owners_.end() || next->first != id);
}

void KeyIsolation::check_documents(size_t tenant, const CompletionRequest& req) const {
  for (size_t i = 0; i < req.documents.size(); ++i) {
    const std::string& id = req.documents[i].id;
    if (!id.empty() && !owns(tenant, id))
      throw RequestError(404, "not_found_error", "unknown chunk id \"" + id + "\" (register it with POST /v1/chunks)",
                         "documents");  // word for word the engine's answer for an id nobody registered
  }
}

void KeyIsolation::redact(nlohmann::json& response) {
  if (auto u = response.find("usage"); u != response.end() && u->is_object())
    (*u)["prompt_tokens_details"] = {{"cached_tokens", 0}};
  auto ext = response.find("chunkfuse");
  if (ext == response.end() || !ext->is_object()) return;
  for (const char* k : {"prefix_hit_tokens", "prefilled_tokens", "recomputed_tokens", "chunk_hits", "chunk_misses",
                        "deduped_chunks"})
    ext->erase(k);
  if (auto t = ext->find("timings_ms"); t != ext->end() && t->is_object())
    for (const char* k : {"lookup", "load", "selection", "recompute"}) t->erase(k);
}

}  // namespace cf

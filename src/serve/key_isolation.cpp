// KeyIsolation: which API key registered which chunk (see key_isolation.h).
#include "serve/key_isolation.h"

namespace cf {

void KeyIsolation::note_registered(size_t tenant, const std::vector<std::string>& ids,
                                   const std::vector<std::string>& texts) {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    owners_.emplace(ids[i], tenant);
    if (i < texts.size()) text_of_.emplace(ids[i], texts[i]);
  }
  ++version_;
}

std::vector<std::string> KeyIsolation::texts_of(size_t tenant) const {
  std::lock_guard lk(mu_);
  std::vector<std::string> out;
  for (const auto& [id, t] : owners_)
    if (t == tenant)
      if (auto it = text_of_.find(id); it != text_of_.end()) out.push_back(it->second);
  return out;
}

uint64_t KeyIsolation::version() const {
  std::lock_guard lk(mu_);
  return version_;
}

bool KeyIsolation::owns(size_t tenant, const std::string& id) const {
  std::lock_guard lk(mu_);
  return owners_.count({id, tenant}) != 0;
}

bool KeyIsolation::release(size_t tenant, const std::string& id, bool& was_owner) {
  std::lock_guard lk(mu_);
  was_owner = owners_.erase({id, tenant}) != 0;
  const auto next = owners_.lower_bound({id, 0});
  const bool none_left = next == owners_.end() || next->first != id;
  if (none_left) text_of_.erase(id);
  if (was_owner) ++version_;
  return was_owner && none_left;
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
  if (auto p = ext->find("passages"); p != ext->end() && p->is_object())
    for (const char* k : {"hit", "computed"}) p->erase(k);  // --match-chunks: the store is shared
  if (auto t = ext->find("timings_ms"); t != ext->end() && t->is_object())
    for (const char* k : {"lookup", "load", "selection", "recompute"}) t->erase(k);
  if (auto a = ext->find("auto"); a != ext->end() && a->is_object())  // what the shared store lacked
    for (const char* k : {"cold_chunks", "cold_tokens", "price_rows"}) a->erase(k);
}

}  // namespace cf

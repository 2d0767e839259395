// Per-key isolation of registered documents (issue 17, item 3: `--isolate-keys`). With API
// keys on, every key is a tenant: a chunk registered (POST /v1/chunks) by one key can be
// read (GET /v1/chunks/{id}), deleted, or used as a document by id only by keys that
// registered it themselves; any other key gets the same 404 as for an id that does not exist.
// Responses to isolated keys carry no cache-use figures (chunk hits and misses, prefix hits,
// prefilled/recomputed tokens, lookup/load timings, --match-chunks' passages hit/computed;
// usage.cached_tokens reads 0), so a key cannot learn whether another key sent a document
// before. With --match-chunks a key's messages are matched against the texts it registered
// only (texts_of; issue 59: the matcher indexed every key's chunks, and
// `chunkfuse.passages.registered` told a key that another had registered a paragraph it guessed).
//
// Deviation from full isolation: the K/V caches themselves stay shared (one store, one
// prefix cache), which keeps reuse across tenants; a key could still time its first token to
// guess a cache hit. Ownership lives in memory: after a restart a key re-registers its texts
// (POST /v1/chunks is idempotent and returns the same ids). /metrics stays global (it needs
// a key, or --metrics-public).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "serve/request.h"

namespace cf {

class KeyIsolation {
 public:
  explicit KeyIsolation(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  // `tenant` is the index of the caller's API key (AccessPolicy::matched_key).
  // texts[i] is ids[i]'s text (kept for texts_of while some tenant holds the id).
  void note_registered(size_t tenant, const std::vector<std::string>& ids, const std::vector<std::string>& texts = {});
  std::vector<std::string> texts_of(size_t tenant) const;  // the texts the tenant registered
  uint64_t version() const;                                 // changes whenever any claim does
  bool owns(size_t tenant, const std::string& id) const;
  // Drops the tenant's claim; true when no tenant holds the id any more (then the chunk
  // itself may go). False also when the tenant never held it.
  bool release(size_t tenant, const std::string& id, bool& was_owner);
  // 404, as for an unknown id, for a document by id the tenant does not own.
  void check_documents(size_t tenant, const CompletionRequest& req) const;

  // Removes the cache-use figures from a completion response or usage chunk (see above).
  static void redact(nlohmann::json& response);

 private:
  const bool enabled_;
  mutable std::mutex mu_;
  std::set<std::pair<std::string, size_t>> owners_;  // (chunk id, tenant)
  std::map<std::string, std::string> text_of_;        // chunk id -> text, while a tenant holds it
  uint64_t version_ = 0;
};

}  // namespace cf

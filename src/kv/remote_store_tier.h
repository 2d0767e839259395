// The chunk store's shared tier (kv/store_tier.h) on Redis (kv/remote_tier.h, issue 13): the
// images several processes share. A remote image is verified like a file (decode_cache_file
// with the reader's model, shape, key id and HMAC); one that fails is never served: reported,
// deleted remotely, a miss (so the caller recomputes and put replaces it). Writes are queued for
// the remote tier's background writer (never on the request's path; a full queue drops them,
// counted); lookups are bounded by the command timeout. Not local: the store's budgets,
// listings, contains() and remove_all() leave it alone (Redis has its own maxmemory).
#pragma once
#include <memory>

#include "kv/chunk_store.h"
#include "kv/remote_tier.h"
#include "kv/store_tier.h"

namespace cf {

class RemoteStoreTier : public StoreTier {
 public:
  // std::invalid_argument without a store key: whoever can write to a shared tier could
  // otherwise have garbage served to every replica (issue 17, item 6).
  RemoteStoreTier(RemoteTierOptions opt, std::shared_ptr<const EntryAuth> auth,
                  const std::function<void(const std::string&)>& report);

  const char* name() const override { return "remote"; }
  bool local() const override { return false; }
  bool may_hold(const std::string&) const override { return true; }  // one GET tells
  TierLoad load(const std::string& id, const CacheFileExpect& expect) override;
  size_t keep(const std::string& id, const std::vector<uint8_t>& image) override;
  bool remove(const std::string& id) override;
  std::optional<size_t> stored_bytes(const std::string&) const override { return std::nullopt; }
  void describe(const std::string& id, ChunkTiers& t) const override;
  void add_stats(ChunkStoreStats& s, uint64_t hits) const override;
  bool flush(int timeout_ms) override;

 private:
  std::unique_ptr<RemoteTier> remote_;  // thread-safe itself
};

}  // namespace cf

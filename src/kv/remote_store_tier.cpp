#include "kv/remote_store_tier.h"

#include <stdexcept>

namespace cf {

RemoteStoreTier::RemoteStoreTier(RemoteTierOptions opt, std::shared_ptr<const EntryAuth> auth,
                                 const std::function<void(const std::string&)>& report) {
  if (!auth)
    throw std::invalid_argument(
        "the remote chunk tier needs a store key (--store-key-file, the same file on every replica): entries "
        "in a shared cache must carry an HMAC tag");
  if (!opt.report) opt.report = report;
  opt.auth = std::move(auth);  // the manifest tags use the store's key
  remote_ = std::make_unique<RemoteTier>(std::move(opt));
}

TierLoad RemoteStoreTier::load(const std::string& id, const CacheFileExpect& expect) {
  TierLoad out;
  auto image = remote_->get(id);
  if (!image) return out;
  try {
    out.cache = std::make_shared<const ChunkCache>(
        decode_cache_file(image->data(), image->size(), remote_->manifest_key(id), expect));
  } catch (const CacheFileError& e) {
    remote_->report_bad(id, e.what());
    out.gone = true;
    return out;
  }
  out.image = std::make_shared<const std::vector<uint8_t>>(std::move(*image));
  return out;
}

size_t RemoteStoreTier::keep(const std::string& id, const std::vector<uint8_t>& image) {
  remote_->put_async(id, image);
  return 0;
}

bool RemoteStoreTier::remove(const std::string& id) {
  remote_->remove_async(id);
  return false;  // no local copy
}

void RemoteStoreTier::describe(const std::string& id, ChunkTiers& t) const { t.remote = remote_->exists(id); }

void RemoteStoreTier::add_stats(ChunkStoreStats& s, uint64_t hits) const {
  s.remote_hits += hits;
  s.has_remote = true;
  s.remote = remote_->stats();
}

bool RemoteStoreTier::flush(int timeout_ms) { return remote_->flush(timeout_ms); }

}  // namespace cf

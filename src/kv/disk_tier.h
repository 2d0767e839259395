// The chunk store's disk tier (kv/store_tier.h): one validated cache file per entry,
// <dir>/<id[0:2]>/<id>.cfkv, written atomically (a private temp file renamed in; fsync'd when
// durable), mapped and fully validated on every load. A file that fails validation
// (truncated, damaged, foreign model, wrong shape, no valid HMAC tag, ...) is never served: it
// is counted, reported in one line ("chunk cache <file>: <reason>, recomputing"), renamed aside
// to <file>.corrupt (kept for inspection, replacing an older one; list/verify do not count it
// as an entry; remove/remove_all delete it) and is a miss. A local tier: the store's disk and
// entry budgets count its files.
//
// describe (a listing's cache state, polled by the web page) remembers each file's header
// metadata with the file's inode, size and times (issue 59): a listing costs one lstat per
// file, and a file is opened again only once it changed (rewritten, replaced, deleted).
#pragma once
#include <sys/types.h>

#include <mutex>
#include <string>
#include <unordered_map>

#include "kv/chunk_store.h"
#include "kv/store_tier.h"

namespace cf {

class DiskTier : public StoreTier {
 public:
  // Creates `dir` (private) when missing; CacheFileError(io_error) when it cannot.
  DiskTier(std::string dir, bool durable, std::function<void(const std::string&)> report);

  const char* name() const override { return "disk"; }
  bool local() const override { return true; }
  bool may_hold(const std::string& id) const override;
  TierLoad load(const std::string& id, const CacheFileExpect& expect) override;
  size_t keep(const std::string& id, const std::vector<uint8_t>& image) override;
  bool remove(const std::string& id) override;
  std::optional<size_t> stored_bytes(const std::string& id) const override;
  void describe(const std::string& id, ChunkTiers& t) const override;
  void add_stats(ChunkStoreStats& s, uint64_t hits) const override;
  bool flush(int) override { return true; }
  std::vector<StoredEntry> scan() const override;
  void list(std::vector<ChunkListEntry>& out) const override;
  void verify(VerifyReport& r, const CacheFileExpect& expect) const override;
  size_t remove_all() override;

  std::string path_for(const std::string& id) const;  // <dir>/<id[0:2]>/<id>.cfkv

 private:
  void report_bad_file(const CacheFileError& e);

  const std::string dir_;
  const bool durable_;
  const std::function<void(const std::string&)> report_;
  mutable std::mutex mu_;  // the counters
  uint64_t loads_ = 0, bytes_read_ = 0, writes_ = 0, write_errors_ = 0, bytes_written_ = 0;
  uint64_t corrupt_ = 0, foreign_ = 0, unauthenticated_ = 0;
  mutable uint64_t header_reads_ = 0;
  struct HeaderMemo {  // describe's: the file it was read from, and its metadata
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0, ctime_ns = 0;
    nlohmann::json extra;
  };
  mutable std::unordered_map<std::string, HeaderMemo> memo_;  // by id, guarded by mu_
};

// <dir>/<id[0:2]>/<id>.cfkv; std::invalid_argument for anything but a chunk id (32 lower-case
// hex digits): "..x" or a NUL would name a file outside the store (issue 29 item 8).
std::string cache_file_path(const std::string& dir, const std::string& id);

}  // namespace cf

// A tier of the chunk store below its memory tier (issue 25 item 3): somewhere sealed cache
// images are kept, a directory (kv/disk_tier.h) or a Redis shared by several processes
// (kv/remote_store_tier.h), and whatever comes next. The store (kv/chunk_store.h) holds them
// as a list, nearest first, and applies one policy to all of them:
//   lookup       memory, then each tier in order; the first that serves the entry wins.
//   promotion    a hit is kept by every tier above the one that served it (written back, as
//                the image it served) and inserted in memory.
//   write-back   put writes the sealed image through to every tier, in order; a tier that
//                fails does not stop the others (the first failure is rethrown).
//   remove       every tier deletes the entry.
// Local tiers (local() true: the directory) are the ones the store's disk and entry budgets
// count and delete from, contains() and listings read, and remove_all() clears; a shared tier
// (Redis) has its own limits (maxmemory). Every tier verifies what it serves against the
// caller's expectation (model, shape, key id, HMAC) and never serves an entry that fails: it
// reports it, drops it, and answers a miss.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cf {

struct ChunkCache;
struct CacheFileExpect;
struct ChunkStoreStats;
struct ChunkTiers;
struct ChunkListEntry;
struct VerifyReport;

// What a tier's lookup found.
struct TierLoad {
  std::shared_ptr<const ChunkCache> cache;  // nullptr: a miss (or a bad entry, reported and dropped)
  // The sealed image it served, when tiers above it may keep a copy (a shared tier's entry
  // written back to the disk tier); null otherwise.
  std::shared_ptr<const std::vector<uint8_t>> image;
  bool gone = false;  // the tier knows it no longer holds the entry (deleted meanwhile, or dropped as bad)
};

// A local tier's entry, as found when the store opens.
struct StoredEntry {
  std::string id;
  size_t bytes = 0;
};

class StoreTier {
 public:
  virtual ~StoreTier() = default;
  virtual const char* name() const = 0;  // "disk", "remote": in reports
  // Local tiers count in the store's budgets and listings; shared ones do not.
  virtual bool local() const = 0;

  // Whether a lookup could hit, asked cheaply before a prefetch is queued (a file exists; a
  // shared tier: one GET tells, so yes).
  virtual bool may_hold(const std::string& id) const = 0;
  // The entry of `id`, verified against `expect`. Never throws for a bad entry (a miss).
  virtual TierLoad load(const std::string& id, const CacheFileExpect& expect) = 0;
  // Keeps the sealed image of `id`; returns the bytes it now holds for it. A tier that writes
  // synchronously throws CacheFileError when it cannot; a queued write never throws.
  virtual size_t keep(const std::string& id, const std::vector<uint8_t>& image) = 0;
  // Deletes `id` (and whatever it kept aside for it); true when a local copy existed.
  virtual bool remove(const std::string& id) = 0;
  // The bytes it holds for `id` now (nullopt: none, or a shared tier); for the budgets' books.
  virtual std::optional<size_t> stored_bytes(const std::string& id) const = 0;

  // Its part of a listing of `id` (no load, no promotion).
  virtual void describe(const std::string& id, ChunkTiers& t) const = 0;
  // Its counters; `hits`: the lookups it served (counted by the store).
  virtual void add_stats(ChunkStoreStats& s, uint64_t hits) const = 0;
  // Waits for queued writes, at most timeout_ms; true when none is left.
  virtual bool flush(int timeout_ms) = 0;

  // Local tiers' housekeeping (a shared tier has none of these: the defaults).
  virtual std::vector<StoredEntry> scan() const { return {}; }  // oldest written first
  virtual void list(std::vector<ChunkListEntry>& out) const { (void)out; }
  virtual void verify(VerifyReport& r, const CacheFileExpect& expect) const {
    (void)r;
    (void)expect;
  }
  virtual size_t remove_all() { return 0; }  // cache entries removed
};

}  // namespace cf

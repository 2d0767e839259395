// The chunk-cache store: a bounded in-memory tier in front of a directory of cache files.
//
//   get(key)  memory tier (LRU, bounded in bytes) -> disk tier (<dir>/<id[0:2]>/<id>.cfkv,
//             mapped and fully validated) -> nullptr. A disk hit is promoted to memory.
//   put(c)    rounds c's K/V through the disk dtype (so both tiers serve the same floats),
//             inserts it in memory and writes the file atomically.
//
// A file that fails validation (truncated, damaged, foreign model, wrong shape, ...) is
// never served: it is counted, reported in one line ("chunk cache <file>: <reason>,
// recomputing"), renamed aside to <file>.corrupt (kept for inspection, replacing an older
// one; list/verify do not count it as an entry; remove/remove_all delete it) and treated as
// a miss. Renaming aside can race with another process that has just written a fresh copy
// of the same key; the worst outcome is one needless recompute, never a bad hit.
//
// Cross-process: files appear only by rename(2), so readers in any process see either no
// file or a complete one. Two writers of one key each write a complete temp file and rename
// it; the content is identical, the last rename wins. Thread-safe within a process.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/cache_file.h"
#include "kv/chunk_cache.h"

namespace cf {

// The model whose caches a store serves: get/put check keys and caches against it.
struct StoreModel {
  uint64_t fingerprint = 0;
  ModelHparams hparams;
};

struct ChunkStoreOptions {
  std::string dir;                              // empty: memory tier only
  size_t memory_budget_bytes = size_t{512} << 20;
  KvDtype disk_dtype = KvDtype::f16;
  // fsync each file and its directory (about 30-70 ms a put here). Off: puts are faster and
  // still atomic; a crash may lose or damage recent files, which get() then recomputes.
  bool durable = true;
  // Needed by get/put/get_or_compute (std::logic_error without it). Without it the store
  // can still list, verify (integrity only: no fingerprint/shape check) and remove.
  std::optional<StoreModel> model;
  // Where defect reports go; default: one line on stderr.
  std::function<void(const std::string&)> report;
};

struct ChunkStoreStats {
  uint64_t memory_hits = 0, disk_hits = 0, misses = 0;
  uint64_t evictions = 0;         // memory-tier entries dropped for the byte budget
  uint64_t puts = 0, computes = 0;
  uint64_t disk_writes = 0, disk_write_errors = 0;
  uint64_t corrupt_files = 0;     // files found bad by get (each reported and moved aside)
  uint64_t disk_bytes_read = 0, disk_bytes_written = 0;
  double disk_load_ms = 0, compute_ms = 0;
  size_t memory_bytes = 0, memory_entries = 0, memory_budget_bytes = 0;
};

struct ChunkListEntry {
  std::string id;
  std::string path;
  size_t n_tokens = 0;
  size_t file_bytes = 0;
  KvDtype dtype = KvDtype::f16;
  ContextKind kind = ContextKind::pic;
  uint64_t model_fingerprint = 0;
  int64_t created_unix_ms = 0;
  double offline_ms = 0;
  std::string problem;  // non-empty when the header/metadata could not be read (see verify)
};

struct VerifyProblem {
  std::string path;
  CacheFileDefect reason;
  std::string message;
};

struct VerifyReport {
  size_t checked = 0, valid = 0;
  size_t valid_bytes = 0;
  std::vector<VerifyProblem> bad;
  size_t corrupt_aside = 0;  // <file>.corrupt left by earlier detections
  size_t temp_files = 0;     // temp files of writers in progress (or that crashed)
  bool ok() const { return bad.empty(); }
};

class ChunkStore {
 public:
  explicit ChunkStore(ChunkStoreOptions opt);

  const ChunkStoreOptions& options() const { return opt_; }
  std::string path_for(const std::string& id) const;  // <dir>/<id[0:2]>/<id>.cfkv

  // nullptr on a miss (including a bad file, which is reported and moved aside).
  std::shared_ptr<const ChunkCache> get(const ChunkKey& key);
  // In memory, or a file of that name exists (not validated): for "skip if present".
  bool contains(const ChunkKey& key) const;
  // Validates the cache against the store's model (std::invalid_argument), rounds it to the
  // disk dtype, inserts it in memory, writes its file. A failed write throws
  // CacheFileError(io_error) after the memory insert.
  std::shared_ptr<const ChunkCache> put(ChunkCache cache);
  // get, else compute() (counted, timed), then put. compute() must return a cache for this
  // key (std::logic_error otherwise). A failed disk write is reported, not thrown.
  // Concurrent calls for one missing key may both compute (no in-flight dedup).
  std::shared_ptr<const ChunkCache> get_or_compute(const ChunkKey& key, const std::function<ChunkCache()>& compute);

  bool remove(const std::string& id);  // memory entry, file and <file>.corrupt; true if any existed
  size_t remove_all();                 // every entry, .corrupt and temp file; returns cache files removed
  void clear_memory();

  std::vector<ChunkListEntry> list() const;  // cache files on disk, sorted by id
  VerifyReport verify() const;                // validates every file fully; changes nothing
  ChunkStoreStats stats() const;

 private:
  struct MemEntry {
    std::string id;
    std::shared_ptr<const ChunkCache> cache;
    size_t bytes;
  };
  void memory_insert(const std::string& id, std::shared_ptr<const ChunkCache> c);
  const StoreModel& model() const;
  void report_bad_file(const CacheFileError& e);

  ChunkStoreOptions opt_;
  mutable std::mutex mu_;
  std::list<MemEntry> lru_;  // front = most recently used
  std::unordered_map<std::string, std::list<MemEntry>::iterator> index_;
  size_t memory_bytes_ = 0;
  ChunkStoreStats stats_;  // guarded by mu_ (memory fields filled in by stats())
};

}  // namespace cf

// The chunk-cache store: a bounded in-memory tier in front of a list of tiers (kv/store_tier.h,
// nearest first): the directory of cache files (kv/disk_tier.h) when ChunkStoreOptions::dir is
// set, then the shared remote tier (kv/remote_store_tier.h) when ::remote is.
//
//   get(key)  memory tier (bounded in bytes) -> each tier in order -> nullptr. A hit below
//             memory is promoted: kept by every tier above the one that served it (a remote
//             image is written to the disk tier) and inserted in memory.
//   put(c)    rounds c's K/V through the disk dtype (so every tier serves the same floats),
//             inserts it in memory and writes the sealed image through to every tier (the
//             disk file atomically, on the caller's thread; the remote one queued).
//
// A tier never serves an entry that fails validation (kv/disk_tier.h: a bad file is counted,
// reported in one line, renamed aside to <file>.corrupt and is a miss; a bad remote image is
// reported and deleted remotely). Renaming aside can race with another process that has just
// written a fresh copy of the same key; the worst outcome is one needless recompute, never a
// bad hit.
//
// Cache management (Cache-Craft §3.3-3.5, digest B2.5-B2.6):
//  - Eviction policy of the memory tier: lru (least recently used goes) or cachecraft
//    (lowest reusability f_r goes, ties to the least recent). f_r starts at 1 for a new
//    entry (one access at CFO = 1, the least credit an access earns; the paper leaves the
//    seed open, digest B6.3) and note_use(id, cfo) adds 1/max(cfo, cfo_floor) on every use
//    whose CFO the caller knows (the Cache-Craft selector does). get() alone moves recency,
//    not f_r: a lookup of a PIC cache's variant index is not a use of its K/V. No aging.
//  - Tiers demote, they do not delete: memory eviction leaves the file (written through at
//    put), counted in `demotions`; a later get reloads it. f_r survives demotion. Real
//    deletion happens only for the disk budget (file bytes) or the entry budget (Cache-Craft's
//    N x M instances: distinct keys with a file or a memory copy), checked after each write:
//    the victim is the lowest-scored (policy order) entry that is not in the memory tier and
//    not being loaded; only when no such entry is left do memory-resident ones go (from both
//    tiers). The entry just written is never a victim, so a budget smaller than one entry is
//    overshot by that entry. Deleting is safe for holders: a loaded cache is decoded into
//    memory (no file stays mapped) and immutable, so a caller's shared_ptr stays valid.
//    The budgets cover the files this store knows: those found in the directory when it was
//    opened, those it wrote and those it loaded. Files another process writes meanwhile are
//    counted when this store first loads them.
//  - A shared K/V budget (options.memory_account, serve/kv_budget.h): each memory-tier entry is
//    charged to it before it is kept, and discharged when it leaves; a charge refused evicts
//    (demotes) the policy's victim and is tried again, and with the tier empty the entry is not
//    kept in memory (a get still returns it; its file is written through as always).
//    release_memory(n) is the budget's give-back: the policy's victims demoted until n bytes are
//    freed. Demotion leaves the file, so what was written through is never lost.
//  - f_r is kept per key id while its entry exists in either tier; deleting an entry drops it.
//    Under the cachecraft policy it is also saved to <dir>/fr-scores.json (atomically, on
//    save_scores() and in the destructor) and read back when a store opens the directory, so
//    scores outlive the process. Several processes on one directory: the last save wins
//    (scores are advice, never correctness).
//  - prefetch(keys) queues disk -> memory loads for a request that is still waiting
//    (Cache-Craft §3.5) on one worker thread owned by the store (started by the first
//    prefetch, joined by the destructor, which drops loads not yet started). Every disk load,
//    get's or prefetch's, is registered while in flight: a get of a key being loaded waits
//    for that load instead of reading the file again, and a get of a key still queued takes
//    the load over. Nothing is served that a get would not serve: the same validation.
//  - Whole caches are loaded, not layer by layer (Alg. 2): on this CPU engine a chunk's
//    prefill takes far longer than reading its file (T_prefill >= T_load), so Eq. 16 gives
//    L_p = 1, i.e. per-layer loading would only ever run one layer ahead of compute, and a
//    load of the whole cache while the request queues already hides it (digest part C).
//    preload_layers() is Eq. 16, for the day that changes.
//
// Remote tier (issue 13; kv/remote_tier.h, kv/remote_store_tier.h): a Redis shared by several
// processes, the last tier of the list. prefetch loads remote entries too. remove deletes
// remotely too; remove_all, list, verify, contains() and the budgets are local only (Redis has
// its own maxmemory). Redis down: remote reads are misses, writes are dropped.
// The design follows LMCache's remote backends (a shared KV tier below local ones). Deviation
// from issue 13: a remote read is not raced against a local recompute; it is always tried
// first, bounded by the command timeout, as it takes milliseconds where recomputing a chunk
// takes about 2 ms a token on this CPU engine (docs/benchmarks-history.md, "Several replicas").
//
// Cross-process: files appear only by rename(2), so readers in any process see either no
// file or a complete one. Two writers of one key each write a complete temp file and rename
// it; the content is identical, the last rename wins. Thread-safe within a process.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kv/cache_file.h"
#include "kv/chunk_cache.h"
#include "kv/entry_auth.h"
#include "kv/kv_account.h"
#include "kv/remote_tier.h"
#include "kv/store_tier.h"

namespace cf {

// The model whose caches a store serves: get/put check keys and caches against it.
struct StoreModel {
  uint64_t fingerprint = 0;
  ModelHparams hparams;
};

// Which memory-tier entry goes first (and which file, when a disk/entry budget deletes).
enum class EvictionPolicy { lru, cachecraft };
const char* eviction_policy_name(EvictionPolicy p);                // "lru", "cachecraft"
bool parse_eviction_policy(std::string_view s, EvictionPolicy& out);  // false on an unknown name

// Cache-Craft Eq. 16 / Alg. 2: layers to preload ahead of compute so that loading never
// stalls it, max(1, ceil((L-1)(1 - T_prefill/T_load) + 1)); 1 when T_prefill >= T_load.
// Rounding up is ours (the paper leaves it open). t_load <= 0: nothing to wait for, 1.
int preload_layers(int n_layers, double t_prefill, double t_load);

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
  // Keyed integrity (entry_auth.h): set, every file written carries an HMAC trailer and a
  // file without a valid one is never served (counted in unauthenticated_files).
  std::shared_ptr<const EntryAuth> auth;
  // Where defect reports go; default: one line on stderr.
  std::function<void(const std::string&)> report;

  EvictionPolicy eviction = EvictionPolicy::lru;
  // Real deletion beyond these (0 = unbounded): bytes of cache files, and entries (distinct
  // keys with a file or a memory copy; Cache-Craft's N x M). Without a directory the entry
  // budget bounds the memory tier, whose evictions are then deletions.
  size_t disk_budget_bytes = 0;
  size_t max_entries = 0;
  // note_use credits 1/max(cfo, cfo_floor): a perfect prefix match (CFO = 0) counts as 100
  // full-recompute accesses instead of dividing by zero (digest B6.3).
  double cfo_floor = 0.01;
  // The shared remote tier below disk (url set) or none.
  std::optional<RemoteTierOptions> remote;
  // The shared K/V budget the memory tier's bytes are charged to (must outlive the store); null:
  // memory_budget_bytes alone bounds it.
  KvAccount* memory_account = nullptr;
};

struct ChunkStoreStats {
  uint64_t memory_hits = 0, disk_hits = 0, remote_hits = 0, misses = 0;
  uint64_t evictions = 0;         // memory-tier entries dropped for the byte (or entry) budget
  uint64_t demotions = 0;         // of those, the ones whose file stays: a later get reloads them
  uint64_t evictions_disk = 0;    // entries deleted for real (file and memory copy) for a budget
  uint64_t disk_loads = 0;        // files read and decoded, by get or prefetch
  uint64_t prefetches = 0;        // loads queued by prefetch (keys not in memory nor in flight)
  uint64_t prefetch_hits = 0;     // gets served by a prefetched load (in memory, or waited for)
  uint64_t prefetch_waits = 0;    // of those, gets that waited for the load to finish
  uint64_t puts = 0, computes = 0;
  uint64_t disk_writes = 0, disk_write_errors = 0;
  uint64_t disk_header_reads = 0;  // cache files opened for a listing's cache state (tiers())
  uint64_t corrupt_files = 0;     // files found bad by get (each reported and moved aside)
  uint64_t foreign_files = 0;     // of those, made by another model or for another shape
  uint64_t unauthenticated_files = 0;  // of those, without a valid HMAC tag (options.auth set)
  uint64_t disk_bytes_read = 0, disk_bytes_written = 0;
  double disk_load_ms = 0, compute_ms = 0;
  size_t memory_bytes = 0, memory_entries = 0, memory_budget_bytes = 0;
  size_t disk_bytes = 0, disk_entries = 0;  // files this store knows (see the header comment)
  size_t entries = 0;                       // distinct keys in either tier
  bool has_remote = false;
  RemoteTierStats remote;                   // the remote tier's own counters (when has_remote)
};

// Where one entry is, for listings (the web page's cache state): no load, no promotion.
struct ChunkTiers {
  bool memory = false;               // in the memory tier
  bool disk = false;                 // its file exists
  std::optional<bool> remote;        // nullopt: no remote tier, or Redis could not be asked
  nlohmann::json extra = nlohmann::json::object();  // the methods' metadata (memory copy, else the file's header)
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
  ~ChunkStore();  // drops queued prefetches, joins the worker, saves f_r (cachecraft policy)
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

  const ChunkStoreOptions& options() const { return opt_; }
  std::string path_for(const std::string& id) const;  // <dir>/<id[0:2]>/<id>.cfkv

  // nullptr on a miss (including a bad file, which is reported and moved aside).
  std::shared_ptr<const ChunkCache> get(const ChunkKey& key);
  // In memory, or a file of that name exists (not validated): for "skip if present".
  bool contains(const ChunkKey& key) const;
  // Where `id` is held (asks Redis when a remote tier is configured).
  ChunkTiers tiers(const std::string& id) const;
  // Validates the cache against the store's model (std::invalid_argument), rounds it to the
  // disk dtype, inserts it in memory, writes its file. A failed write throws
  // CacheFileError(io_error) after the memory insert.
  std::shared_ptr<const ChunkCache> put(ChunkCache cache);
  // get, else compute() (counted, timed), then put. compute() must return a cache for this
  // key (std::logic_error otherwise). A failed disk write is reported, not thrown.
  // Concurrent calls for one missing key may both compute (no in-flight dedup).
  std::shared_ptr<const ChunkCache> get_or_compute(const ChunkKey& key, const std::function<ChunkCache()>& compute);

  // f_r += 1/max(cfo, cfo_floor) for the entry `id` (cfo: the share of the chunk the caller
  // recomputes when reusing it, Cache-Craft Eq. 12). Ids the store does not hold are ignored.
  void note_use(const std::string& id, double cfo);
  void note_use(const ChunkKey& key, double cfo) { note_use(key.id(), cfo); }
  double score(const std::string& id) const;  // f_r; 0 for an id the store does not hold

  // Queues disk -> memory loads of the keys not in memory (nor in flight) whose file
  // exists; returns at once. Keys of another model are skipped.
  void prefetch(const std::vector<ChunkKey>& keys);
  void wait_prefetches();  // until the queue is empty and no prefetch load runs
  // Writes f_r of every entry to <dir>/fr-scores.json (cachecraft policy with a directory;
  // otherwise does nothing). Returns false if the write failed (reported).
  bool save_scores();

  bool remove(const std::string& id);  // memory entry, file and <file>.corrupt; true if any existed
  size_t remove_all();                 // every entry, .corrupt, temp and score file; returns cache files removed
  void clear_memory();                 // drops the memory tier (files and f_r stay; not counted)
  // Evicts memory-tier entries in the policy's order (demoted: their files stay) until `bytes`
  // are freed or the tier is empty; returns the bytes freed (the shared K/V budget's give-back).
  size_t release_memory(size_t bytes);

  std::vector<ChunkListEntry> list() const;  // cache files on disk, sorted by id
  VerifyReport verify() const;                // validates every file fully; changes nothing
  ChunkStoreStats stats() const;
  // Waits for the remote tier's queued writes, at most timeout_ms; true when none is left.
  bool flush_remote(int timeout_ms);

 private:
  struct MemEntry {
    std::string id;
    std::shared_ptr<const ChunkCache> cache;
    size_t bytes;
    bool prefetched = false;  // loaded by prefetch and not yet served by a get
  };
  // What the store knows of a key besides its memory copy; exists while either tier holds it.
  struct EntryMeta {
    double score = 1.0;     // f_r
    uint64_t last_use = 0;  // tick of the last get/put/load
    size_t file_bytes = 0;
    bool on_disk = false;
  };
  // A load from the tiers in flight. queued: waiting for the prefetch worker (a get may take it over).
  struct Load {
    bool queued = false, by_prefetch = false, done = false, cancelled = false;
    int tier = -1;  // the tier that served it (index into tiers_)
    std::shared_ptr<const ChunkCache> result;
  };
  using MemList = std::list<MemEntry>;

  const StoreModel& model() const;
  CacheFileExpect expect_for(const StoreModel& m, const std::string& id) const;
  // Walks the tiers; the first that serves `id` wins (load.tier), and the nearer tiers keep
  // a copy. nullptr: no tier has it (or only bad copies, reported and dropped).
  std::shared_ptr<const ChunkCache> load_entry(const std::string& id, Load& load);
  void promote_above(size_t served_by, const std::string& id, const std::vector<uint8_t>& image);
  void finish_load(const std::string& id, const std::shared_ptr<Load>& load, std::shared_ptr<const ChunkCache> c);
  void prefetch_worker();
  // All below: mu_ held.
  void memory_insert_locked(const std::string& id, std::shared_ptr<const ChunkCache> c, bool prefetched);
  MemList::iterator memory_victim_locked();
  size_t evict_one_locked();  // the policy's victim out of memory (a demotion when its file stays); its bytes
  void memory_erase_locked(MemList::iterator it);
  EntryMeta& meta_locked(const std::string& id);  // creates a fresh entry (f_r = 1)
  void touch_locked(const std::string& id);
  void note_file_locked(const std::string& id, size_t bytes);
  void forget_file_locked(const std::string& id);  // file gone; drops the meta if nothing holds it
  size_t entry_count_locked() const;
  // Picks and unlinks from the books the entries a budget deletes; returns their ids.
  std::vector<std::string> budget_victims_locked(const std::string& keep);
  void count_lookup_locked(const Load& load);  // a hit of the tier that served it, or a miss
  void scan_tiers();  // constructor: learns the local tiers' entries (and f_r from the sidecar)
  void delete_local(const std::vector<std::string>& ids);  // from the local tiers (budgets)

  ChunkStoreOptions opt_;
  mutable std::mutex mu_;
  MemList lru_;  // front = most recently used
  std::unordered_map<std::string, MemList::iterator> index_;
  std::unordered_map<std::string, EntryMeta> meta_;
  std::unordered_map<std::string, std::shared_ptr<Load>> loading_;
  std::condition_variable loaded_cv_;  // a load finished
  std::deque<std::string> prefetch_queue_;
  std::condition_variable prefetch_cv_;  // queue grew, or stopping
  size_t prefetch_running_ = 0;
  bool stopping_ = false;
  std::thread prefetch_thread_;
  uint64_t tick_ = 0;
  size_t memory_bytes_ = 0, disk_bytes_ = 0, disk_entries_ = 0;
  ChunkStoreStats stats_;  // guarded by mu_ (memory fields filled in by stats(), the tiers' by each tier)
  std::vector<std::unique_ptr<StoreTier>> tiers_;  // below memory, nearest first (kv/store_tier.h); thread-safe each
  std::vector<uint64_t> tier_hits_;                // lookups each tier served (mu_)
  bool local_tier_ = false;                        // a local tier exists: the budgets count its entries
  std::string scores_path_;                        // <dir>/fr-scores.json with a local tier
};

}  // namespace cf

// The remote tier of the chunk store (issue 13): cache file images shared by several
// processes (`chunkfuse serve` replicas, `chunks precompute` batch jobs) through Redis, over
// hiredis (Debian libhiredis-dev). It moves bytes; what they mean (the cache file format of
// kv/cache_file.h, verified in full against the reader's model and key) is the store's job.
//
// Layout of one entry (the key id already hashes model fingerprint + tokens + variant):
//   <prefix>{<id>}                   manifest, JSON {"format":2,"raw":R,"zlen":Z,"sum":"<16 hex>","pieces":P,
//                                    "tag":"<64 hex>"}
//   <prefix>{<id>}:<sum>:<i>         piece i < P of the zstd-compressed image (piece_bytes each, the last shorter)
// `sum` is XXH3-64 of the compressed image; R its size once decompressed. The {id} hash tag
// keeps an entry in one slot of a Redis Cluster (MULTI needs that).
//
// `tag` (format 2, issue 29 item 9) is the store key's HMAC-SHA256 over the compressed bytes
// as stored, bound to the entry: HMAC(key, "CFREMOT2" | u64 len(id) | id | u64 R | u64 Z |
// HMAC(key, compressed bytes)), integers little-endian. A reader bounds R and Z by
// max_entry_bytes before it allocates or fetches anything, and checks the tag before it
// decompresses, so whoever can write to Redis without the key can make it neither allocate
// past the entry limit nor inflate a zstd bomb. Format 1 (no tag; before issue 29) is refused
// with a message saying so; the default key prefix moved from chunkfuse:v1: to chunkfuse:v2:
// with it, so replicas of both builds sharing one Redis during an upgrade do not delete each
// other's entries (old ones age out under maxmemory). The image inside still carries its own
// HMAC trailer, which the store checks as for a file.
//
// Atomic commit: a writer sends the pieces and the manifest in one MULTI/EXEC, under WATCH of
// the manifest it read (a transaction another writer's commit overtook is aborted and read
// again, up to 8 times, so the pieces it deletes are always those of the manifest it replaces;
// issue 59), so a reader
// sees all of an entry or nothing; a writer killed mid-way leaves nothing (Redis drops a
// transaction whose EXEC never came). Pieces are named by the checksum of what they hold, so
// two writers of one entry write the same keys with the same bytes; a writer replacing an
// entry with other bytes deletes the old pieces in the same transaction.
//
// A reader checks the manifest, that every piece is there (eviction can take pieces one by
// one: "incomplete", a miss whose manifest is deleted), the checksum and the decompressed
// size; an entry failing those, or the store's own verification (report_bad), is counted,
// reported and deleted, never returned. Nothing here can serve a partial or altered entry.
//
// Faults: every command has a timeout; a failed connection is dropped from the pool, and
// after a failed connect or a lost connection (timeout) no new one is tried for retry_ms
// (reads are misses, writes are dropped and counted), so a dead or stalled Redis costs
// requests at most one timeout per retry_ms, then nothing but the recompute; the first call
// after retry_ms reconnects. Writes go through one background thread and a bounded queue
// (entries and bytes); a full queue drops the write and counts it.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

struct redisContext;

namespace cf {

class EntryAuth;

struct RedisUrl {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
};
// redis://host[:port][/db]; throws std::invalid_argument naming what is wrong.
RedisUrl parse_redis_url(const std::string& url);

struct RemoteTierOptions {
  std::string url;  // redis://host:port[/db]
  int connect_timeout_ms = 500;
  int command_timeout_ms = 2000;
  int retry_ms = 1000;            // after a failed connect, no new attempt for this long
  size_t pool_size = 4;           // connections at most (readers and the writer)
  size_t piece_bytes = size_t{1} << 20;
  int zstd_level = 1;
  // The per-entry limit: an image (decompressed) or its compressed form larger than this is
  // refused as bad, checked on the manifest before anything is fetched or allocated.
  size_t max_entry_bytes = size_t{1} << 30;
  size_t queue_entries = 64;      // pending writes at most; more are dropped (counted)
  size_t queue_bytes = size_t{256} << 20;
  int flush_timeout_ms = 30000;   // the destructor waits this long for queued writes
  std::string key_prefix = "chunkfuse:v2:";
  std::function<void(const std::string&)> report;  // defect/fault lines; default stderr
  // The store key (required: std::invalid_argument without it): tags every manifest; a
  // manifest without a valid tag is never decompressed. The chunk store passes its own.
  std::shared_ptr<const EntryAuth> auth;
  // Tests only: called between a writer's (or deleter's) read of the manifest and its
  // transaction, to interleave two writers of one id deterministically (issue 59).
  std::function<void(const std::string& id)> before_commit;
};

inline constexpr int kRemoteFormat = 2;

// An entry's manifest (the JSON above), parsed and bounded; nullopt when unreadable. Format 1
// manifests parse (format 1, no tag) so that their pieces can be deleted; readers refuse them.
struct RemoteManifest {
  int format = kRemoteFormat;
  size_t raw = 0, zlen = 0, pieces = 0;
  std::string sum;
  std::string tag;  // 64 hex digits (format 2)
};
std::optional<RemoteManifest> parse_remote_manifest(const std::string& text);
// Whether a reader may fetch the entry `m` describes: format 2, raw at most max_entry_bytes,
// zlen at most what zstd can make of that (ZSTD_compressBound), pieces at most zlen. False with
// `why` set otherwise. Checked before any piece is fetched or any buffer sized (issue 29 item 9).
bool remote_manifest_within(const RemoteManifest& m, size_t max_entry_bytes, std::string& why);
// The manifest tag of an entry (see the header comment), 64 hex digits.
std::string remote_entry_tag(const EntryAuth& auth, const std::string& id, size_t raw, const uint8_t* z, size_t zlen);
// The image from the concatenated pieces `z`: manifest bounds, length, checksum, tag (over
// the compressed bytes, before decompressing) and decompressed size checked against the
// manifest (raw allocated only once the zstd frame agrees); nullopt with `why` set when
// anything differs. Pure: the reader's checks, and a fuzz target's.
std::optional<std::vector<uint8_t>> unpack_remote_entry(const RemoteManifest& m, const std::vector<uint8_t>& z,
                                                        size_t max_entry_bytes, const EntryAuth& auth,
                                                        const std::string& id, std::string& why);

inline constexpr double kRemoteLatencyBoundsMs[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000};

struct RemoteTierStats {
  uint64_t hits = 0, misses = 0;
  uint64_t errors = 0;          // connection failures, timeouts, error replies (reads and writes)
  uint64_t corrupt = 0;         // entries found bad (here or by the store) and deleted
  uint64_t incomplete = 0;      // manifests whose pieces were gone (evicted, replaced)
  uint64_t writes = 0;          // entries committed
  uint64_t writes_present = 0;  // writes skipped: the same bytes were there already
  uint64_t write_errors = 0;    // writes that failed (Redis down, out of memory, ...)
  uint64_t writes_dropped = 0;  // writes dropped because the queue was full
  uint64_t deletes = 0;
  uint64_t commit_retries = 0;  // transactions aborted by WATCH (another writer of the id) and read again
  uint64_t bytes_read = 0, bytes_written = 0;  // compressed bytes over the wire (pieces)
  uint64_t connects = 0, connect_failures = 0;
  uint64_t reads = 0;           // get calls that reached Redis
  double read_ms_sum = 0;
  std::vector<uint64_t> read_ms_buckets;  // cumulative counts per kRemoteLatencyBoundsMs, then +Inf
  size_t queue_entries = 0, queue_bytes = 0;
  bool up = false;              // the last command succeeded
};

class RemoteTier {
 public:
  explicit RemoteTier(RemoteTierOptions opt);  // std::invalid_argument on a bad url; connects lazily
  ~RemoteTier();                               // flushes queued writes (flush_timeout_ms), closes
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  const RemoteTierOptions& options() const { return opt_; }

  // The cache file image stored for `id`, checked as the header says; nullopt on a miss, a
  // fault (counted) or a bad entry (counted, reported, deleted).
  std::optional<std::vector<uint8_t>> get(const std::string& id);
  // Queues the image for writing; false when dropped (queue full or stopping).
  bool put_async(const std::string& id, std::vector<uint8_t> image);
  // Whether Redis holds an entry for `id` (its manifest; pieces are not checked). nullopt:
  // Redis could not be asked (down, error). For listings, not on a request's path.
  std::optional<bool> exists(const std::string& id);
  // The store found the image of `id` bad (`why`): counted, reported, deleted (queued, in
  // order with writes, so a fresh put queued after it lands after the delete).
  void report_bad(const std::string& id, const std::string& why);
  void remove_async(const std::string& id);
  // Waits until the queue is empty and no write runs, at most timeout_ms; true if it is.
  bool flush(int timeout_ms);
  RemoteTierStats stats() const;

  std::string manifest_key(const std::string& id) const;
  std::string piece_key(const std::string& id, const std::string& sum, size_t i) const;

 private:
  struct Task {
    std::string id;
    std::vector<uint8_t> image;  // empty: delete the entry
  };
  redisContext* acquire();
  void release(redisContext* c, bool ok);
  redisContext* connect();
  void note_error(const std::string& what, bool connection_lost);
  bool write_entry(redisContext* c, const Task& t);
  // Deletes the entry, only if its manifest is still *manifest_text when given.
  bool delete_entry(redisContext* c, const std::string& id, const std::string* manifest_text);
  std::optional<std::string> watch_manifest(redisContext* c, const std::string& id, bool& ok);
  bool unwatch(redisContext* c);
  bool read_transaction(redisContext* c, size_t n_cmds, bool& aborted, std::string& error);
  static constexpr int kCommitAttempts = 8;
  void worker();

  RemoteTierOptions opt_;
  RedisUrl url_;
  mutable std::mutex mu_;
  std::vector<redisContext*> idle_;
  size_t open_ = 0;               // connections in idle_ or lent out
  double down_until_ms_ = 0;      // no connect attempt before this (steady clock)
  std::condition_variable pool_cv_;
  std::deque<Task> queue_;
  size_t queue_bytes_ = 0;
  bool busy_ = false, stopping_ = false;
  std::condition_variable queue_cv_, idle_cv_;
  RemoteTierStats stats_;
  std::thread worker_;
};

}  // namespace cf

#include "kv/chunk_store.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>

#include "base/clock.h"
#include "kv/store_paths.h"

namespace cf {
namespace fs = std::filesystem;
namespace {

constexpr const char* kExt = ".cfkv";
constexpr const char* kCorruptExt = ".corrupt";
constexpr const char* kScoresFile = "fr-scores.json";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class FileKind { cache, corrupt, temp, other };

FileKind classify(const std::string& name) {
  if (!name.empty() && name[0] == '.' && name.find(".tmp.") != std::string::npos) return FileKind::temp;
  if (ends_with(name, kCorruptExt)) return FileKind::corrupt;
  if (ends_with(name, kExt)) return FileKind::cache;
  return FileKind::other;
}

// Calls fn(path, kind) for every file in the store's two-hex-digit subdirectories. Symlinks
// (to folders or files) are skipped: list, verify and remove_all never leave the store.
template <class Fn>
void for_each_file(const std::string& dir, Fn fn) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  std::vector<fs::path> files;
  for (const auto& sub : fs::directory_iterator(dir, ec)) {
    const std::string sn = sub.path().filename().string();
    if (sn.size() != 2 || !is_real_directory(sub.path())) continue;
    for (const auto& f : fs::directory_iterator(sub.path(), ec))
      if (is_real_file(f.path())) files.push_back(f.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    FileKind kind = classify(p.filename().string());
    // Only <id[0:2]>/<id>.cfkv is an entry: a stray name could not be addressed by path_for.
    const std::string stem = p.stem().string();
    if (kind == FileKind::cache && (!is_chunk_id(stem) || p.parent_path().filename() != stem.substr(0, 2)))
      kind = FileKind::other;
    fn(p, kind);
  }
}

}  // namespace

const char* eviction_policy_name(EvictionPolicy p) { return p == EvictionPolicy::cachecraft ? "cachecraft" : "lru"; }

bool parse_eviction_policy(std::string_view s, EvictionPolicy& out) {
  if (s == "lru") out = EvictionPolicy::lru;
  else if (s == "cachecraft") out = EvictionPolicy::cachecraft;
  else return false;
  return true;
}

int preload_layers(int n_layers, double t_prefill, double t_load) {
  if (n_layers <= 1 || !(t_load > 0) || t_prefill >= t_load) return 1;
  const double lp = (n_layers - 1) * (1.0 - t_prefill / t_load) + 1.0;
  // The tolerance keeps an exact product (the paper's 5 layers at 1:2 -> 3) from rounding up.
  return std::clamp(static_cast<int>(std::ceil(lp - 1e-9)), 1, n_layers);
}

ChunkStore::ChunkStore(ChunkStoreOptions opt) : opt_(std::move(opt)) {
  if (!opt_.report) opt_.report = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  if (!(opt_.cfo_floor > 0)) throw std::invalid_argument("chunk store: cfo_floor must be > 0");
  if (!opt_.dir.empty()) {
    std::error_code ec;
    create_private_directories(opt_.dir, ec);
    if (ec) throw CacheFileError(CacheFileDefect::io_error, opt_.dir, "cannot create the store directory: " + ec.message());
    scan_dir();
  }
  if (opt_.remote) {
    // Whoever can write to a shared tier could otherwise have garbage served to every replica
    // (issue 17, item 6): a remote tier is only used with keyed entries.
    if (!opt_.auth)
      throw std::invalid_argument(
          "the remote chunk tier needs a store key (--store-key-file, the same file on every replica): entries "
          "in a shared cache must carry an HMAC tag");
    if (!opt_.remote->report) opt_.remote->report = opt_.report;
    opt_.remote->auth = opt_.auth;  // the manifest tags use the store's key
    remote_ = std::make_unique<RemoteTier>(*opt_.remote);
  }
}

ChunkStore::~ChunkStore() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (const std::string& id : prefetch_queue_)
      if (auto it = loading_.find(id); it != loading_.end() && it->second->queued) loading_.erase(it);
    prefetch_queue_.clear();
  }
  prefetch_cv_.notify_all();
  if (prefetch_thread_.joinable()) prefetch_thread_.join();
  try {
    save_scores();
  } catch (...) {  // a destructor must not throw; save_scores reports its own failures
  }
}

void ChunkStore::scan_dir() {
  struct Found {
    std::string id;
    size_t bytes;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  for_each_file(opt_.dir, [&](const fs::path& p, FileKind kind) {
    if (kind != FileKind::cache) return;
    std::error_code ec;
    const auto bytes = fs::file_size(p, ec);
    const auto mtime = fs::last_write_time(p, ec);
    if (!ec) found.push_back({p.stem().string(), static_cast<size_t>(bytes), mtime});
  });
  // Recency of files from earlier runs: their write order.
  std::stable_sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  std::lock_guard lock(mu_);
  for (const Found& f : found) {
    note_file_locked(f.id, f.bytes);
    meta_[f.id].last_use = ++tick_;
  }
  if (opt_.eviction != EvictionPolicy::cachecraft) return;
  std::ifstream in(scores_path());
  if (!in) return;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& [id, score] : j.at("scores").items())
      if (auto it = meta_.find(id); it != meta_.end()) it->second.score = score.get<double>();
  } catch (const std::exception& e) {
    opt_.report("chunk store " + scores_path() + ": unreadable f_r scores (" + e.what() + "), starting from 1");
  }
}

std::string ChunkStore::scores_path() const { return opt_.dir + "/" + kScoresFile; }

bool ChunkStore::save_scores() {
  if (opt_.eviction != EvictionPolicy::cachecraft || opt_.dir.empty()) return true;
  nlohmann::json scores = nlohmann::json::object();
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, m] : meta_)
      if (m.on_disk) scores[id] = m.score;
  }
  const std::string path = scores_path();
  if (scores.empty()) {  // an empty store leaves no score file behind
    std::error_code ec;
    fs::remove(path, ec);
    return true;
  }
  try {  // atomic and private: readers see the old or the new scores
    write_private_file_atomic(path, nlohmann::json{{"version", 1}, {"scores", scores}}.dump(), opt_.durable);
  } catch (const std::exception& e) {
    opt_.report("chunk store " + path + ": cannot write the f_r scores: " + e.what());
    return false;
  }
  return true;
}

std::string ChunkStore::path_for(const std::string& id) const {
  // Only the 32-hex-digit form: "..x" or a NUL would name a file outside the store, whoever
  // passes it (issue 29 item 8).
  if (!is_chunk_id(id)) throw std::invalid_argument("chunk store: not a chunk id (32 lower-case hex digits): \"" +
                                                    printable_chunk_id(id) + "\"");
  return opt_.dir + "/" + id.substr(0, 2) + "/" + id + kExt;
}

const StoreModel& ChunkStore::model() const {
  if (!opt_.model) throw std::logic_error("chunk store: get/put need the store's model (ChunkStoreOptions::model)");
  return *opt_.model;
}

// --- bookkeeping (mu_ held)

ChunkStore::EntryMeta& ChunkStore::meta_locked(const std::string& id) { return meta_[id]; }

void ChunkStore::touch_locked(const std::string& id) { meta_locked(id).last_use = ++tick_; }

void ChunkStore::note_file_locked(const std::string& id, size_t bytes) {
  EntryMeta& m = meta_locked(id);
  if (m.on_disk) disk_bytes_ -= m.file_bytes;
  else ++disk_entries_;
  m.on_disk = true;
  m.file_bytes = bytes;
  disk_bytes_ += bytes;
}

void ChunkStore::forget_file_locked(const std::string& id) {
  auto it = meta_.find(id);
  if (it == meta_.end()) return;
  if (it->second.on_disk) {
    disk_bytes_ -= it->second.file_bytes;
    --disk_entries_;
    it->second.on_disk = false;
    it->second.file_bytes = 0;
  }
  if (!index_.count(id)) meta_.erase(it);
}

size_t ChunkStore::entry_count_locked() const {
  size_t n = disk_entries_;
  for (const MemEntry& e : lru_)
    if (auto it = meta_.find(e.id); it == meta_.end() || !it->second.on_disk) ++n;
  return n;
}

void ChunkStore::memory_erase_locked(MemList::iterator it) {
  memory_bytes_ -= it->bytes;
  index_.erase(it->id);
  lru_.erase(it);
}

ChunkStore::MemList::iterator ChunkStore::memory_victim_locked() {
  auto victim = std::prev(lru_.end());
  if (opt_.eviction != EvictionPolicy::cachecraft) return victim;
  auto score_of = [&](const std::string& id) {
    auto it = meta_.find(id);
    return it == meta_.end() ? 0.0 : it->second.score;
  };
  // From the least recent forward: the lowest f_r, ties to the least recent.
  double best = score_of(victim->id);
  for (auto it = victim; it != lru_.begin();) {
    --it;
    if (const double s = score_of(it->id); s < best) {
      best = s;
      victim = it;
    }
  }
  return victim;
}

void ChunkStore::memory_insert_locked(const std::string& id, std::shared_ptr<const ChunkCache> c, bool prefetched) {
  const size_t bytes = c->memory_bytes();
  if (auto it = index_.find(id); it != index_.end()) memory_erase_locked(it->second);  // same key, same content
  if (bytes > opt_.memory_budget_bytes) return;  // would evict everything and still not fit
  // Without a disk tier the entry budget bounds the memory tier.
  const size_t max_resident = opt_.dir.empty() && opt_.max_entries ? opt_.max_entries : SIZE_MAX;
  while ((memory_bytes_ + bytes > opt_.memory_budget_bytes || lru_.size() >= max_resident) && !lru_.empty()) {
    auto victim = memory_victim_locked();
    const std::string vid = victim->id;
    memory_erase_locked(victim);
    ++stats_.evictions;
    auto m = meta_.find(vid);
    if (m != meta_.end() && m->second.on_disk) ++stats_.demotions;
    else if (m != meta_.end()) meta_.erase(m);  // no file: the entry is gone, and its f_r with it
  }
  lru_.push_front({id, std::move(c), bytes, prefetched});
  index_[id] = lru_.begin();
  memory_bytes_ += bytes;
  meta_locked(id);
}

std::vector<std::string> ChunkStore::budget_victims_locked(const std::string& keep) {
  std::vector<std::string> victims;
  if (opt_.dir.empty() || (!opt_.disk_budget_bytes && !opt_.max_entries)) return victims;
  auto over = [&] {
    return (opt_.disk_budget_bytes && disk_bytes_ > opt_.disk_budget_bytes) ||
           (opt_.max_entries && entry_count_locked() > opt_.max_entries);
  };
  const bool by_score = opt_.eviction == EvictionPolicy::cachecraft;
  while (over()) {
    // Smallest (resident, f_r or 0, last use): demoted entries first, then the policy's order.
    const std::string* victim = nullptr;
    std::tuple<bool, double, uint64_t> best{};
    for (const auto& [id, m] : meta_) {
      const bool resident = index_.count(id) > 0;
      if (id == keep || loading_.count(id) || (!m.on_disk && !resident)) continue;
      const std::tuple<bool, double, uint64_t> rank{resident, by_score ? m.score : 0.0, m.last_use};
      if (!victim || rank < best) {
        victim = &id;
        best = rank;
      }
    }
    if (!victim) break;  // everything left is kept: the budget is overshot for now
    const std::string id = *victim;
    if (auto it = index_.find(id); it != index_.end()) memory_erase_locked(it->second);
    forget_file_locked(id);
    meta_.erase(id);
    victims.push_back(id);
    ++stats_.evictions_disk;
  }
  return victims;
}

void ChunkStore::delete_files(const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    std::error_code ec;
    fs::remove(path_for(id), ec);
  }
}

// --- loading

void ChunkStore::report_bad_file(const CacheFileError& e) {
  {
    std::lock_guard lock(mu_);
    ++stats_.corrupt_files;
    if (e.reason() == CacheFileDefect::foreign_model || e.reason() == CacheFileDefect::shape_mismatch)
      ++stats_.foreign_files;
    if (e.reason() == CacheFileDefect::unauthenticated) ++stats_.unauthenticated_files;
    forget_file_locked(fs::path(e.path()).stem().string());
  }
  opt_.report("chunk cache " + std::string(e.what()) + ", recomputing");
  // Move it aside so the next reader does not pay for validating it again; if that fails
  // (e.g. it is gone already), deleting is just as safe.
  std::error_code ec;
  fs::rename(e.path(), e.path() + kCorruptExt, ec);
  if (ec) fs::remove(e.path(), ec);
}

// What a stored entry of `id` must be to be served (file or remote image alike).
CacheFileExpect ChunkStore::expect_for(const StoreModel& m, const std::string& id) const {
  CacheFileExpect expect;
  expect.model_fingerprint = m.fingerprint;
  expect.hparams = m.hparams;
  expect.key_id = id;
  expect.auth = opt_.auth.get();
  return expect;
}

std::shared_ptr<const ChunkCache> ChunkStore::read_file(const std::string& id) {
  const StoreModel& m = model();
  const std::string path = path_for(id);
  const double t0 = now_ms();
  try {
    auto c = std::make_shared<const ChunkCache>(read_cache_file(path, expect_for(m, id)));
    std::error_code ec;
    const auto bytes = fs::file_size(path, ec);
    std::lock_guard lock(mu_);
    ++stats_.disk_loads;
    stats_.disk_load_ms += now_ms() - t0;
    if (!ec) stats_.disk_bytes_read += bytes;
    return c;
  } catch (const CacheFileError& e) {
    if (e.reason() != CacheFileDefect::not_found) {
      report_bad_file(e);
    } else {
      std::lock_guard lock(mu_);
      forget_file_locked(id);  // deleted behind our back (another process, a budget)
    }
  }
  return nullptr;
}

std::shared_ptr<const ChunkCache> ChunkStore::read_remote(const std::string& id) {
  const StoreModel& m = model();
  const double t0 = now_ms();
  auto image = remote_->get(id);
  if (!image) return nullptr;
  std::shared_ptr<const ChunkCache> c;
  try {
    c = std::make_shared<const ChunkCache>(
        decode_cache_file(image->data(), image->size(), remote_->manifest_key(id), expect_for(m, id)));
  } catch (const CacheFileError& e) {
    remote_->report_bad(id, e.what());
    return nullptr;
  }
  bool written = false;
  if (!opt_.dir.empty()) {  // the disk tier keeps it: a memory eviction then costs a file read, not a remote one
    try {
      const std::string path = path_for(id);
      std::error_code ec;
      // Private and never through a planted symlink, as put's (issue 29 item 11).
      if (!ensure_private_directory(fs::path(path).parent_path(), ec))
        throw CacheFileError(CacheFileDefect::io_error, path, "its folder is not a private real directory: " + ec.message());
      write_cache_bytes(path, *image, opt_.durable);
      written = true;
    } catch (const CacheFileError& e) {
      opt_.report("chunk cache " + std::string(e.what()) + " (remote entry kept in memory only)");
    }
  }
  std::lock_guard lock(mu_);
  stats_.disk_load_ms += now_ms() - t0;
  if (written) {
    ++stats_.disk_writes;
    stats_.disk_bytes_written += image->size();
  } else if (!opt_.dir.empty()) {
    ++stats_.disk_write_errors;
  }
  return c;
}

std::shared_ptr<const ChunkCache> ChunkStore::load_entry(const std::string& id, Load& load) {
  // Never throws: it runs on the prefetch thread, where an escaping exception (an allocation
  // failure, say) would end the process, and a get's load must finish to wake its waiters
  // (issue 29 item 9). A load that fails is a miss: the caller recomputes.
  try {
    if (!opt_.dir.empty())
      if (auto c = read_file(id)) return c;
    if (!remote_) return nullptr;
    auto c = read_remote(id);
    std::lock_guard lock(mu_);
    load.remote = c != nullptr;
    return c;
  } catch (const std::exception& e) {
    opt_.report("chunk cache " + id + ": load failed (" + e.what() + "), recomputing");
  } catch (...) {
    opt_.report("chunk cache " + id + ": load failed, recomputing");
  }
  return nullptr;
}

void ChunkStore::finish_load(const std::string& id, const std::shared_ptr<Load>& load,
                             std::shared_ptr<const ChunkCache> c) {
  std::error_code ec;
  const auto bytes = c ? fs::file_size(path_for(id), ec) : 0;
  std::lock_guard lock(mu_);
  load->done = true;
  load->result = c;
  if (auto it = loading_.find(id); it != loading_.end() && it->second == load) loading_.erase(it);
  if (c && !load->cancelled) {  // cancelled: removed while loading, keep nothing
    if (!ec) note_file_locked(id, static_cast<size_t>(bytes));
    touch_locked(id);
    memory_insert_locked(id, std::move(c), load->by_prefetch);
  }
  loaded_cv_.notify_all();
}

std::shared_ptr<const ChunkCache> ChunkStore::get(const ChunkKey& key) {
  const StoreModel& m = model();
  const std::string& id = key.id();
  std::shared_ptr<Load> load;
  {
    std::unique_lock lock(mu_);
    if (auto it = index_.find(id); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.memory_hits;
      if (it->second->prefetched) {
        ++stats_.prefetch_hits;
        it->second->prefetched = false;
      }
      touch_locked(id);
      return it->second->cache;
    }
    if ((opt_.dir.empty() && !remote_) || key.model_fingerprint() != m.fingerprint) {
      ++stats_.misses;
      return nullptr;
    }
    if (auto it = loading_.find(id); it == loading_.end()) {
      load = std::make_shared<Load>();
      loading_[id] = load;
    } else if (it->second->queued) {  // a prefetch not started yet: load it ourselves
      load = it->second;
      load->queued = false;
      load->by_prefetch = false;
    } else {  // in flight: wait for it rather than read the file twice
      load = it->second;
      loaded_cv_.wait(lock, [&] { return load->done; });
      if (!load->result) {
        ++stats_.misses;
        return nullptr;
      }
      ++(load->remote ? stats_.remote_hits : stats_.disk_hits);
      if (load->by_prefetch) {
        ++stats_.prefetch_hits;
        ++stats_.prefetch_waits;
        if (auto mem = index_.find(id); mem != index_.end()) mem->second->prefetched = false;
      }
      return load->result;
    }
  }
  auto c = load_entry(id, *load);
  finish_load(id, load, c);
  std::lock_guard lock(mu_);
  ++(c ? (load->remote ? stats_.remote_hits : stats_.disk_hits) : stats_.misses);
  return c;
}

bool ChunkStore::contains(const ChunkKey& key) const {
  {
    std::lock_guard lock(mu_);
    if (index_.count(key.id())) return true;
  }
  std::error_code ec;
  return !opt_.dir.empty() && fs::is_regular_file(path_for(key.id()), ec);
}

ChunkTiers ChunkStore::tiers(const std::string& id) const {
  ChunkTiers t;
  {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(id); it != index_.end()) {
      t.memory = true;
      t.extra = it->second->cache->extra;
    }
  }
  const std::string path = opt_.dir.empty() ? "" : path_for(id);
  t.disk = !path.empty() && is_real_file(path);
  if (t.disk && !t.memory) {
    try {
      t.extra = read_cache_file_info(path).extra;
    } catch (const std::exception&) {  // a bad file is reported when it is loaded
    }
  }
  if (remote_) t.remote = remote_->exists(id);
  return t;
}

void ChunkStore::prefetch(const std::vector<ChunkKey>& keys) {
  const StoreModel& m = model();
  if (opt_.dir.empty() && !remote_) return;
  std::vector<std::string> ids;
  for (const ChunkKey& k : keys) {
    std::error_code ec;
    if (k.model_fingerprint() == m.fingerprint &&
        (remote_ || fs::is_regular_file(path_for(k.id()), ec)))  // remote: one GET tells
      ids.push_back(k.id());
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    for (const std::string& id : ids) {
      if (index_.count(id) || loading_.count(id)) continue;
      auto load = std::make_shared<Load>();
      load->queued = load->by_prefetch = true;
      loading_[id] = std::move(load);
      prefetch_queue_.push_back(id);
      ++stats_.prefetches;
    }
    if (!prefetch_queue_.empty() && !prefetch_thread_.joinable())
      prefetch_thread_ = std::thread([this] { prefetch_worker(); });
  }
  prefetch_cv_.notify_one();
}

void ChunkStore::prefetch_worker() {
  std::unique_lock lock(mu_);
  while (true) {
    prefetch_cv_.wait(lock, [&] { return stopping_ || !prefetch_queue_.empty(); });
    if (stopping_) return;
    const std::string id = std::move(prefetch_queue_.front());
    prefetch_queue_.pop_front();
    auto it = loading_.find(id);
    if (it != loading_.end() && it->second->queued) {  // else taken over by a get, or removed
      auto load = it->second;
      load->queued = false;
      ++prefetch_running_;
      lock.unlock();
      auto c = load_entry(id, *load);
      finish_load(id, load, std::move(c));
      lock.lock();
      --prefetch_running_;
    }
    loaded_cv_.notify_all();  // wait_prefetches
  }
}

void ChunkStore::wait_prefetches() {
  std::unique_lock lock(mu_);
  loaded_cv_.wait(lock, [&] { return stopping_ || (prefetch_queue_.empty() && prefetch_running_ == 0); });
}

void ChunkStore::note_use(const std::string& id, double cfo) {
  const double credit = 1.0 / (cfo >= opt_.cfo_floor ? cfo : opt_.cfo_floor);  // NaN: the floor
  std::lock_guard lock(mu_);
  if (auto it = meta_.find(id); it != meta_.end()) it->second.score += credit;
}

double ChunkStore::score(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = meta_.find(id);
  return it == meta_.end() ? 0.0 : it->second.score;
}

std::shared_ptr<const ChunkCache> ChunkStore::put(ChunkCache cache) {
  const StoreModel& m = model();
  const ModelHparams& h = cache.kv.hparams();
  if (cache.key.model_fingerprint() != m.fingerprint)
    throw std::invalid_argument("chunk store: cache " + cache.key.id() + " belongs to another model");
  if (h.n_layers != m.hparams.n_layers || h.n_kv_heads != m.hparams.n_kv_heads || h.head_dim != m.hparams.head_dim)
    throw std::invalid_argument("chunk store: cache " + cache.key.id() + " has another model shape");
  if (cache.n_tokens() != cache.key.tokens().size() || cache.n_tokens() == 0)
    throw std::invalid_argument("chunk store: cache " + cache.key.id() + " holds " + std::to_string(cache.n_tokens()) +
                                " entries for " + std::to_string(cache.key.tokens().size()) + " tokens");
  round_to_dtype(cache.kv, opt_.disk_dtype);
  auto c = std::make_shared<const ChunkCache>(std::move(cache));
  const std::string& id = c->key.id();
  {
    std::lock_guard lock(mu_);
    touch_locked(id);
    memory_insert_locked(id, c, false);
    if (opt_.dir.empty() && !index_.count(id)) meta_.erase(id);  // too large to keep anywhere
    ++stats_.puts;
  }
  if (opt_.dir.empty() && !remote_) return c;
  std::vector<uint8_t> image = encode_cache_file(*c, opt_.disk_dtype);
  if (opt_.auth) opt_.auth->seal(image);  // the same sealed image on disk and in the remote tier
  // Queued once the disk write is done or has failed: the remote tier gets its own copy.
  struct RemoteQueue {
    RemoteTier* remote;
    const std::string& id;
    std::vector<uint8_t>& image;
    ~RemoteQueue() {
      if (remote) remote->put_async(id, std::move(image));
    }
  } queue_remote{remote_.get(), id, image};
  if (!opt_.dir.empty()) {
    const std::string path = path_for(id);
    std::error_code ec;
    std::vector<std::string> victims;
    try {
      if (!ensure_private_directory(fs::path(path).parent_path(), ec))  // a planted symlink: never write through it
        throw CacheFileError(CacheFileDefect::io_error, path, "its folder is missing or not a real directory");
      const size_t n = write_cache_bytes(path, image, opt_.durable);
      std::lock_guard lock(mu_);
      ++stats_.disk_writes;
      stats_.disk_bytes_written += n;
      note_file_locked(id, n);
      victims = budget_victims_locked(id);
    } catch (const CacheFileError&) {
      std::lock_guard lock(mu_);
      ++stats_.disk_write_errors;
      // An older file of this key, if any, is intact (writes are atomic) and still counted.
      if (auto m = meta_.find(id); m != meta_.end() && !m->second.on_disk && !index_.count(id)) meta_.erase(m);
      throw;
    }
    delete_files(victims);
  }
  return c;
}
std::shared_ptr<const ChunkCache> ChunkStore::get_or_compute(const ChunkKey& key,
                                                             const std::function<ChunkCache()>& compute) {
  if (auto c = get(key)) return c;
  const double t0 = now_ms();
  ChunkCache fresh = compute();
  {
    std::lock_guard lock(mu_);
    ++stats_.computes;
    stats_.compute_ms += now_ms() - t0;
  }
  if (fresh.key.id() != key.id())
    throw std::logic_error("chunk store: compute for " + key.id() + " returned " + fresh.key.id());
  try {
    return put(std::move(fresh));
  } catch (const CacheFileError& e) {
    opt_.report("chunk cache " + std::string(e.what()) + " (kept in memory only)");
    std::lock_guard lock(mu_);
    auto it = index_.find(key.id());
    if (it == index_.end()) throw;  // too large for the memory tier too: nothing to return
    return it->second->cache;
  }
}

bool ChunkStore::remove(const std::string& id) {
  (void)path_for(id);  // std::invalid_argument for anything but a key id (issue 29 item 8)
  bool removed = false;
  {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(id); it != index_.end()) {
      memory_erase_locked(it->second);
      removed = true;
    }
    if (auto it = loading_.find(id); it != loading_.end()) {
      it->second->cancelled = true;                   // a running load keeps nothing
      if (it->second->queued) loading_.erase(it);     // a queued one is skipped by the worker
    }
    forget_file_locked(id);
    meta_.erase(id);
  }
  if (!opt_.dir.empty() && is_real_directory(fs::path(path_for(id)).parent_path())) {
    std::error_code ec;
    const std::string path = path_for(id);
    removed |= fs::remove(path, ec);
    removed |= fs::remove(path + kCorruptExt, ec);
  }
  if (remote_) remote_->remove_async(id);
  return removed;
}

size_t ChunkStore::remove_all() {
  {
    std::lock_guard lock(mu_);
    for (auto it = loading_.begin(); it != loading_.end();) {
      it->second->cancelled = true;
      it = it->second->queued ? loading_.erase(it) : std::next(it);
    }
    prefetch_queue_.clear();
    lru_.clear();
    index_.clear();
    meta_.clear();
    memory_bytes_ = disk_bytes_ = disk_entries_ = 0;
  }
  loaded_cv_.notify_all();  // wait_prefetches: the queue is empty now
  size_t n = 0;
  for_each_file(opt_.dir, [&](const fs::path& p, FileKind kind) {
    if (kind == FileKind::other) return;
    std::error_code ec;
    if (fs::remove(p, ec) && kind == FileKind::cache) ++n;
  });
  std::error_code ec;
  if (!opt_.dir.empty() && fs::is_directory(opt_.dir, ec))
    for (const auto& sub : fs::directory_iterator(opt_.dir, ec))
      if (sub.path().filename().string().size() == 2 && is_real_directory(sub.path()) && fs::is_empty(sub.path(), ec))
        fs::remove(sub.path(), ec);
  if (!opt_.dir.empty()) fs::remove(scores_path(), ec);
  return n;
}

void ChunkStore::clear_memory() {
  std::lock_guard lock(mu_);
  for (const MemEntry& e : lru_)
    if (auto m = meta_.find(e.id); m != meta_.end() && !m->second.on_disk) meta_.erase(m);  // gone for good
  lru_.clear();
  index_.clear();
  memory_bytes_ = 0;
}

std::vector<ChunkListEntry> ChunkStore::list() const {
  std::vector<ChunkListEntry> out;
  for_each_file(opt_.dir, [&](const fs::path& p, FileKind kind) {
    if (kind != FileKind::cache) return;
    ChunkListEntry e;
    e.path = p.string();
    e.id = p.stem().string();
    try {
      const CacheFileInfo info = read_cache_file_info(e.path);
      e.n_tokens = info.n_tokens;
      e.file_bytes = info.file_bytes;
      e.dtype = info.dtype;
      e.kind = info.kind;
      e.model_fingerprint = info.model_fingerprint;
      e.created_unix_ms = info.created_unix_ms;
      e.offline_ms = info.offline_ms;
    } catch (const CacheFileError& err) {
      if (err.reason() == CacheFileDefect::not_found) return;  // removed meanwhile
      e.problem = defect_name(err.reason());
      std::error_code ec;
      e.file_bytes = static_cast<size_t>(fs::file_size(p, ec));
    }
    out.push_back(std::move(e));
  });
  return out;
}

VerifyReport ChunkStore::verify() const {
  VerifyReport r;
  for_each_file(opt_.dir, [&](const fs::path& p, FileKind kind) {
    if (kind == FileKind::corrupt) ++r.corrupt_aside;
    if (kind == FileKind::temp) ++r.temp_files;
    if (kind != FileKind::cache) return;
    CacheFileExpect expect;
    expect.key_id = p.stem().string();
    expect.auth = opt_.auth.get();
    if (opt_.model) {
      expect.model_fingerprint = opt_.model->fingerprint;
      expect.hparams = opt_.model->hparams;
    }
    try {
      read_cache_file(p.string(), expect);
      ++r.checked;
      ++r.valid;
      std::error_code ec;
      r.valid_bytes += static_cast<size_t>(fs::file_size(p, ec));
    } catch (const CacheFileError& e) {
      if (e.reason() == CacheFileDefect::not_found) return;  // removed meanwhile
      ++r.checked;
      r.bad.push_back({p.string(), e.reason(), e.what()});
    }
  });
  return r;
}

bool ChunkStore::flush_remote(int timeout_ms) { return !remote_ || remote_->flush(timeout_ms); }

ChunkStoreStats ChunkStore::stats() const {
  std::lock_guard lock(mu_);
  ChunkStoreStats s = stats_;
  if (remote_) {
    s.has_remote = true;
    s.remote = remote_->stats();
  }
  s.memory_bytes = memory_bytes_;
  s.memory_entries = lru_.size();
  s.memory_budget_bytes = opt_.memory_budget_bytes;
  s.disk_bytes = disk_bytes_;
  s.disk_entries = disk_entries_;
  s.entries = entry_count_locked();
  return s;
}

}  // namespace cf

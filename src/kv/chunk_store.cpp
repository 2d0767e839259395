#include "kv/chunk_store.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>

#include "base/clock.h"
#include "base/enum_names.h"
#include "kv/disk_tier.h"
#include "kv/remote_store_tier.h"
#include "kv/store_paths.h"

namespace cf {
namespace fs = std::filesystem;
namespace {

constexpr const char* kScoresFile = "fr-scores.json";

// The tiers below memory, nearest first: the directory, then the shared remote tier.
std::vector<std::unique_ptr<StoreTier>> make_tiers(ChunkStoreOptions& opt) {
  std::vector<std::unique_ptr<StoreTier>> tiers;
  if (!opt.dir.empty()) tiers.push_back(std::make_unique<DiskTier>(opt.dir, opt.durable, opt.report));
  if (opt.remote) tiers.push_back(std::make_unique<RemoteStoreTier>(*opt.remote, opt.auth, opt.report));
  return tiers;
}

}  // namespace

constexpr EnumName<EvictionPolicy> kEvictionPolicyNames[] = {{EvictionPolicy::lru, "lru"},
                                                               {EvictionPolicy::cachecraft, "cachecraft"}};

const char* eviction_policy_name(EvictionPolicy p) { return enum_name(kEvictionPolicyNames, p); }

bool parse_eviction_policy(std::string_view s, EvictionPolicy& out) {
  return parse_enum_name(kEvictionPolicyNames, s, out);
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
  tiers_ = make_tiers(opt_);
  tier_hits_.assign(tiers_.size(), 0);
  for (const auto& t : tiers_) local_tier_ |= t->local();
  if (local_tier_) scores_path_ = opt_.dir + "/" + kScoresFile;
  scan_tiers();
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

void ChunkStore::scan_tiers() {
  std::lock_guard lock(mu_);
  for (const auto& t : tiers_) {
    if (!t->local()) continue;
    for (const StoredEntry& e : t->scan()) {  // recency of entries from earlier runs: their write order
      note_file_locked(e.id, e.bytes);
      meta_[e.id].last_use = ++tick_;
    }
  }
  if (opt_.eviction != EvictionPolicy::cachecraft || scores_path_.empty()) return;
  std::ifstream in(scores_path_);
  if (!in) return;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& [id, score] : j.at("scores").items())
      if (auto it = meta_.find(id); it != meta_.end()) it->second.score = score.get<double>();
  } catch (const std::exception& e) {
    opt_.report("chunk store " + scores_path_ + ": unreadable f_r scores (" + e.what() + "), starting from 1");
  }
}

bool ChunkStore::save_scores() {
  if (opt_.eviction != EvictionPolicy::cachecraft || scores_path_.empty()) return true;
  nlohmann::json scores = nlohmann::json::object();
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, m] : meta_)
      if (m.on_disk) scores[id] = m.score;
  }
  if (scores.empty()) {  // an empty store leaves no score file behind
    std::error_code ec;
    fs::remove(scores_path_, ec);
    return true;
  }
  try {  // atomic and private: readers see the old or the new scores
    write_private_file_atomic(scores_path_, nlohmann::json{{"version", 1}, {"scores", scores}}.dump(), opt_.durable);
  } catch (const std::exception& e) {
    opt_.report("chunk store " + scores_path_ + ": cannot write the f_r scores: " + e.what());
    return false;
  }
  return true;
}

std::string ChunkStore::path_for(const std::string& id) const { return cache_file_path(opt_.dir, id); }

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
  if (opt_.memory_account) opt_.memory_account->discharge(it->bytes);
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
  // Without a local tier the entry budget bounds the memory tier.
  const size_t max_resident = !local_tier_ && opt_.max_entries ? opt_.max_entries : SIZE_MAX;
  while ((memory_bytes_ + bytes > opt_.memory_budget_bytes || lru_.size() >= max_resident) && !lru_.empty())
    evict_one_locked();
  // Under a shared K/V budget: room beside the reservations and the other caches, made from
  // this tier's own entries only; none left, and the entry is not kept in memory.
  while (opt_.memory_account && !opt_.memory_account->try_charge(bytes)) {
    if (lru_.empty()) return;
    evict_one_locked();
  }
  lru_.push_front({id, std::move(c), bytes, prefetched});
  index_[id] = lru_.begin();
  memory_bytes_ += bytes;
  meta_locked(id);
}

size_t ChunkStore::evict_one_locked() {
  auto victim = memory_victim_locked();
  const std::string vid = victim->id;
  const size_t bytes = victim->bytes;
  memory_erase_locked(victim);
  ++stats_.evictions;
  auto m = meta_.find(vid);
  if (m != meta_.end() && m->second.on_disk) ++stats_.demotions;
  else if (m != meta_.end()) meta_.erase(m);  // no file: the entry is gone, and its f_r with it
  return bytes;
}

size_t ChunkStore::release_memory(size_t bytes) {
  std::lock_guard lock(mu_);
  size_t freed = 0;
  while (freed < bytes && !lru_.empty()) freed += evict_one_locked();
  return freed;
}

std::vector<std::string> ChunkStore::budget_victims_locked(const std::string& keep) {
  std::vector<std::string> victims;
  if (!local_tier_ || (!opt_.disk_budget_bytes && !opt_.max_entries)) return victims;
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

void ChunkStore::delete_local(const std::vector<std::string>& ids) {
  for (const std::string& id : ids)
    for (const auto& t : tiers_)
      if (t->local()) t->remove(id);
}

// --- loading

// What a stored entry of `id` must be to be served (file or remote image alike).
CacheFileExpect ChunkStore::expect_for(const StoreModel& m, const std::string& id) const {
  CacheFileExpect expect;
  expect.model_fingerprint = m.fingerprint;
  expect.hparams = m.hparams;
  expect.key_id = id;
  expect.auth = opt_.auth.get();
  return expect;
}

void ChunkStore::promote_above(size_t served_by, const std::string& id, const std::vector<uint8_t>& image) {
  for (size_t i = 0; i < served_by; ++i) {
    try {  // the nearer tiers keep it: an eviction then costs a nearer read, not this tier's
      tiers_[i]->keep(id, image);
    } catch (const CacheFileError& e) {
      opt_.report("chunk cache " + std::string(e.what()) + " (" + tiers_[served_by]->name() +
                  " entry kept in memory only)");
    }
  }
}

std::shared_ptr<const ChunkCache> ChunkStore::load_entry(const std::string& id, Load& load) {
  // Never throws: it runs on the prefetch thread, where an escaping exception (an allocation
  // failure, say) would end the process, and a get's load must finish to wake its waiters
  // (issue 29 item 9). A load that fails is a miss: the caller recomputes.
  try {
    const CacheFileExpect expect = expect_for(model(), id);
    for (size_t i = 0; i < tiers_.size(); ++i) {
      const double t0 = now_ms();
      TierLoad found = tiers_[i]->load(id, expect);
      if (found.gone && tiers_[i]->local()) {
        std::lock_guard lock(mu_);
        forget_file_locked(id);  // moved aside as bad, or deleted behind our back (another process, a budget)
      }
      if (!found.cache) continue;
      if (found.image) promote_above(i, id, *found.image);
      std::lock_guard lock(mu_);
      stats_.disk_load_ms += now_ms() - t0;
      load.tier = static_cast<int>(i);
      return found.cache;
    }
  } catch (const std::exception& e) {
    opt_.report("chunk cache " + id + ": load failed (" + e.what() + "), recomputing");
  } catch (...) {
    opt_.report("chunk cache " + id + ": load failed, recomputing");
  }
  return nullptr;
}

void ChunkStore::finish_load(const std::string& id, const std::shared_ptr<Load>& load,
                             std::shared_ptr<const ChunkCache> c) {
  std::optional<size_t> bytes;  // what the local tier now holds (the budgets' books)
  for (size_t i = 0; c && i < tiers_.size() && !bytes; ++i)
    if (tiers_[i]->local()) bytes = tiers_[i]->stored_bytes(id);
  std::lock_guard lock(mu_);
  load->done = true;
  load->result = c;
  if (auto it = loading_.find(id); it != loading_.end() && it->second == load) loading_.erase(it);
  if (c && !load->cancelled) {  // cancelled: removed while loading, keep nothing
    if (bytes) note_file_locked(id, *bytes);
    touch_locked(id);
    memory_insert_locked(id, std::move(c), load->by_prefetch);
  }
  loaded_cv_.notify_all();
}

void ChunkStore::count_lookup_locked(const Load& load) {
  if (load.result && load.tier >= 0) ++tier_hits_[static_cast<size_t>(load.tier)];
  else ++stats_.misses;
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
    if (tiers_.empty() || key.model_fingerprint() != m.fingerprint) {
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
    } else {  // in flight: wait for it rather than read it twice
      load = it->second;
      loaded_cv_.wait(lock, [&] { return load->done; });
      count_lookup_locked(*load);
      if (load->result && load->by_prefetch) {
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
  count_lookup_locked(*load);
  return c;
}

bool ChunkStore::contains(const ChunkKey& key) const {
  {
    std::lock_guard lock(mu_);
    if (index_.count(key.id())) return true;
  }
  for (const auto& t : tiers_)
    if (t->local() && t->may_hold(key.id())) return true;
  return false;
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
  for (const auto& tier : tiers_) tier->describe(id, t);
  return t;
}

void ChunkStore::prefetch(const std::vector<ChunkKey>& keys) {
  const StoreModel& m = model();
  if (tiers_.empty()) return;
  std::vector<std::string> ids;
  for (const ChunkKey& k : keys) {
    if (k.model_fingerprint() != m.fingerprint) continue;
    for (const auto& t : tiers_)
      if (t->may_hold(k.id())) {
        ids.push_back(k.id());
        break;
      }
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
    if (!local_tier_ && !index_.count(id)) meta_.erase(id);  // too large to keep anywhere
    ++stats_.puts;
  }
  if (tiers_.empty()) return c;
  std::vector<uint8_t> image = encode_cache_file(*c, opt_.disk_dtype);
  if (opt_.auth) opt_.auth->seal(image);  // the same sealed image in every tier
  // Write-through to every tier; one that fails does not stop the others.
  std::exception_ptr failure;
  std::vector<std::string> victims;
  for (const auto& t : tiers_) {
    try {
      const size_t n = t->keep(id, image);
      if (!t->local()) continue;
      std::lock_guard lock(mu_);
      note_file_locked(id, n);
      victims = budget_victims_locked(id);
    } catch (const CacheFileError&) {
      if (!failure) failure = std::current_exception();
      if (!t->local()) continue;
      std::lock_guard lock(mu_);
      // An older copy of this key, if any, is intact (writes are atomic) and still counted.
      if (auto e = meta_.find(id); e != meta_.end() && !e->second.on_disk && !index_.count(id)) meta_.erase(e);
    }
  }
  delete_local(victims);
  if (failure) std::rethrow_exception(failure);
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
  for (const auto& t : tiers_) removed |= t->remove(id);
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
    if (opt_.memory_account) opt_.memory_account->discharge(memory_bytes_);
    lru_.clear();
    index_.clear();
    meta_.clear();
    memory_bytes_ = disk_bytes_ = disk_entries_ = 0;
  }
  loaded_cv_.notify_all();  // wait_prefetches: the queue is empty now
  size_t n = 0;
  for (const auto& t : tiers_) n += t->remove_all();  // local tiers only: a shared one keeps its entries
  std::error_code ec;
  if (!scores_path_.empty()) fs::remove(scores_path_, ec);
  return n;
}

void ChunkStore::clear_memory() {
  std::lock_guard lock(mu_);
  for (const MemEntry& e : lru_)
    if (auto m = meta_.find(e.id); m != meta_.end() && !m->second.on_disk) meta_.erase(m);  // gone for good
  if (opt_.memory_account) opt_.memory_account->discharge(memory_bytes_);
  lru_.clear();
  index_.clear();
  memory_bytes_ = 0;
}

std::vector<ChunkListEntry> ChunkStore::list() const {
  std::vector<ChunkListEntry> out;
  for (const auto& t : tiers_) t->list(out);
  return out;
}

VerifyReport ChunkStore::verify() const {
  VerifyReport r;
  CacheFileExpect expect;
  expect.auth = opt_.auth.get();
  if (opt_.model) {
    expect.model_fingerprint = opt_.model->fingerprint;
    expect.hparams = opt_.model->hparams;
  }
  for (const auto& t : tiers_) t->verify(r, expect);
  return r;
}

bool ChunkStore::flush_remote(int timeout_ms) {
  bool flushed = true;
  for (const auto& t : tiers_) flushed &= t->flush(timeout_ms);
  return flushed;
}

ChunkStoreStats ChunkStore::stats() const {
  std::lock_guard lock(mu_);
  ChunkStoreStats s = stats_;
  for (size_t i = 0; i < tiers_.size(); ++i) tiers_[i]->add_stats(s, tier_hits_[i]);
  s.memory_bytes = memory_bytes_;
  s.memory_entries = lru_.size();
  s.memory_budget_bytes = opt_.memory_budget_bytes;
  s.disk_bytes = disk_bytes_;
  s.disk_entries = disk_entries_;
  s.entries = entry_count_locked();
  return s;
}

}  // namespace cf

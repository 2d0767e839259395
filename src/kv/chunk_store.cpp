#include "kv/chunk_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace cf {
namespace fs = std::filesystem;
namespace {

constexpr const char* kExt = ".cfkv";
constexpr const char* kCorruptExt = ".corrupt";

double steady_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

// Calls fn(path, kind) for every file in the store's two-hex-digit subdirectories.
template <class Fn>
void for_each_file(const std::string& dir, Fn fn) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  std::vector<fs::path> files;
  for (const auto& sub : fs::directory_iterator(dir, ec)) {
    const std::string sn = sub.path().filename().string();
    if (sn.size() != 2 || !sub.is_directory(ec)) continue;
    for (const auto& f : fs::directory_iterator(sub.path(), ec))
      if (f.is_regular_file(ec)) files.push_back(f.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& p : files) fn(p, classify(p.filename().string()));
}

}  // namespace

ChunkStore::ChunkStore(ChunkStoreOptions opt) : opt_(std::move(opt)) {
  if (!opt_.report) opt_.report = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  if (!opt_.dir.empty()) {
    std::error_code ec;
    fs::create_directories(opt_.dir, ec);
    if (ec) throw CacheFileError(CacheFileDefect::io_error, opt_.dir, "cannot create the store directory: " + ec.message());
  }
}

std::string ChunkStore::path_for(const std::string& id) const {
  if (id.size() < 2) throw std::invalid_argument("chunk store: bad key id '" + id + "'");
  return opt_.dir + "/" + id.substr(0, 2) + "/" + id + kExt;
}

const StoreModel& ChunkStore::model() const {
  if (!opt_.model) throw std::logic_error("chunk store: get/put need the store's model (ChunkStoreOptions::model)");
  return *opt_.model;
}

void ChunkStore::report_bad_file(const CacheFileError& e) {
  {
    std::lock_guard lock(mu_);
    ++stats_.corrupt_files;
  }
  opt_.report("chunk cache " + std::string(e.what()) + ", recomputing");
  // Move it aside so the next reader does not pay for validating it again; if that fails
  // (e.g. it is gone already), deleting is just as safe.
  std::error_code ec;
  fs::rename(e.path(), e.path() + kCorruptExt, ec);
  if (ec) fs::remove(e.path(), ec);
}

std::shared_ptr<const ChunkCache> ChunkStore::get(const ChunkKey& key) {
  const StoreModel& m = model();
  const std::string& id = key.id();
  {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(id); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.memory_hits;
      return it->second->cache;
    }
  }
  if (!opt_.dir.empty() && key.model_fingerprint() == m.fingerprint) {
    const double t0 = steady_ms();
    try {
      CacheFileExpect expect;
      expect.model_fingerprint = m.fingerprint;
      expect.hparams = m.hparams;
      expect.key_id = id;
      auto c = std::make_shared<const ChunkCache>(read_cache_file(path_for(id), expect));
      {
        std::lock_guard lock(mu_);
        ++stats_.disk_hits;
        stats_.disk_load_ms += steady_ms() - t0;
        stats_.disk_bytes_read += c->n_tokens() * 2 * static_cast<size_t>(c->kv.n_layers()) * c->kv.kv_dim() *
                                  dtype_size(opt_.disk_dtype);
      }
      memory_insert(id, c);
      return c;
    } catch (const CacheFileError& e) {
      if (e.reason() != CacheFileDefect::not_found) report_bad_file(e);
    }
  }
  std::lock_guard lock(mu_);
  ++stats_.misses;
  return nullptr;
}

bool ChunkStore::contains(const ChunkKey& key) const {
  {
    std::lock_guard lock(mu_);
    if (index_.count(key.id())) return true;
  }
  std::error_code ec;
  return !opt_.dir.empty() && fs::is_regular_file(path_for(key.id()), ec);
}

void ChunkStore::memory_insert(const std::string& id, std::shared_ptr<const ChunkCache> c) {
  const size_t bytes = c->memory_bytes();
  std::lock_guard lock(mu_);
  if (auto it = index_.find(id); it != index_.end()) {  // replace (same key, same content)
    memory_bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  if (bytes > opt_.memory_budget_bytes) return;  // would evict everything and still not fit
  while (memory_bytes_ + bytes > opt_.memory_budget_bytes && !lru_.empty()) {
    memory_bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().id);
    lru_.pop_back();
    ++stats_.evictions;
  }
  lru_.push_front({id, std::move(c), bytes});
  index_[id] = lru_.begin();
  memory_bytes_ += bytes;
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
  memory_insert(c->key.id(), c);
  {
    std::lock_guard lock(mu_);
    ++stats_.puts;
  }
  if (!opt_.dir.empty()) {
    const std::string path = path_for(c->key.id());
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    try {
      const size_t n = write_cache_file(path, *c, opt_.disk_dtype, opt_.durable);
      std::lock_guard lock(mu_);
      ++stats_.disk_writes;
      stats_.disk_bytes_written += n;
    } catch (const CacheFileError&) {
      std::lock_guard lock(mu_);
      ++stats_.disk_write_errors;
      throw;
    }
  }
  return c;
}

std::shared_ptr<const ChunkCache> ChunkStore::get_or_compute(const ChunkKey& key,
                                                             const std::function<ChunkCache()>& compute) {
  if (auto c = get(key)) return c;
  const double t0 = steady_ms();
  ChunkCache fresh = compute();
  {
    std::lock_guard lock(mu_);
    ++stats_.computes;
    stats_.compute_ms += steady_ms() - t0;
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
  bool removed = false;
  {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(id); it != index_.end()) {
      memory_bytes_ -= it->second->bytes;
      lru_.erase(it->second);
      index_.erase(it);
      removed = true;
    }
  }
  if (!opt_.dir.empty()) {
    std::error_code ec;
    const std::string path = path_for(id);
    removed |= fs::remove(path, ec);
    removed |= fs::remove(path + kCorruptExt, ec);
  }
  return removed;
}

size_t ChunkStore::remove_all() {
  clear_memory();
  size_t n = 0;
  for_each_file(opt_.dir, [&](const fs::path& p, FileKind kind) {
    if (kind == FileKind::other) return;
    std::error_code ec;
    if (fs::remove(p, ec) && kind == FileKind::cache) ++n;
  });
  std::error_code ec;
  if (!opt_.dir.empty() && fs::is_directory(opt_.dir, ec))
    for (const auto& sub : fs::directory_iterator(opt_.dir, ec))
      if (sub.path().filename().string().size() == 2 && fs::is_empty(sub.path(), ec)) fs::remove(sub.path(), ec);
  return n;
}

void ChunkStore::clear_memory() {
  std::lock_guard lock(mu_);
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

ChunkStoreStats ChunkStore::stats() const {
  std::lock_guard lock(mu_);
  ChunkStoreStats s = stats_;
  s.memory_bytes = memory_bytes_;
  s.memory_entries = lru_.size();
  s.memory_budget_bytes = opt_.memory_budget_bytes;
  return s;
}

}  // namespace cf

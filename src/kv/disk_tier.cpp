#include "kv/disk_tier.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "kv/store_paths.h"

namespace cf {
namespace fs = std::filesystem;
namespace {

constexpr const char* kExt = ".cfkv";
constexpr const char* kCorruptExt = ".corrupt";

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

std::string cache_file_path(const std::string& dir, const std::string& id) {
  if (!is_chunk_id(id)) throw std::invalid_argument("chunk store: not a chunk id (32 lower-case hex digits): \"" +
                                                    printable_chunk_id(id) + "\"");
  return dir + "/" + id.substr(0, 2) + "/" + id + kExt;
}

DiskTier::DiskTier(std::string dir, bool durable, std::function<void(const std::string&)> report)
    : dir_(std::move(dir)), durable_(durable), report_(std::move(report)) {
  std::error_code ec;
  create_private_directories(dir_, ec);
  if (ec) throw CacheFileError(CacheFileDefect::io_error, dir_, "cannot create the store directory: " + ec.message());
}

std::string DiskTier::path_for(const std::string& id) const { return cache_file_path(dir_, id); }

bool DiskTier::may_hold(const std::string& id) const {
  std::error_code ec;
  return fs::is_regular_file(path_for(id), ec);
}

void DiskTier::report_bad_file(const CacheFileError& e) {
  {
    std::lock_guard lock(mu_);
    ++corrupt_;
    if (e.reason() == CacheFileDefect::foreign_model || e.reason() == CacheFileDefect::shape_mismatch) ++foreign_;
    if (e.reason() == CacheFileDefect::unauthenticated) ++unauthenticated_;
  }
  report_("chunk cache " + std::string(e.what()) + ", recomputing");
  // Move it aside so the next reader does not pay for validating it again; if that fails
  // (e.g. it is gone already), deleting is just as safe.
  std::error_code ec;
  fs::rename(e.path(), e.path() + kCorruptExt, ec);
  if (ec) fs::remove(e.path(), ec);
}

TierLoad DiskTier::load(const std::string& id, const CacheFileExpect& expect) {
  const std::string path = path_for(id);
  TierLoad out;
  try {
    out.cache = std::make_shared<const ChunkCache>(read_cache_file(path, expect));
    std::error_code ec;
    const auto bytes = fs::file_size(path, ec);
    std::lock_guard lock(mu_);
    ++loads_;
    if (!ec) bytes_read_ += bytes;
  } catch (const CacheFileError& e) {
    if (e.reason() != CacheFileDefect::not_found) report_bad_file(e);
    out.gone = true;  // moved aside, or deleted behind our back (another process, a budget)
  }
  return out;
}

size_t DiskTier::keep(const std::string& id, const std::vector<uint8_t>& image) {
  const std::string path = path_for(id);
  try {
    std::error_code ec;
    // Private and never through a planted symlink (issue 29 item 11).
    if (!ensure_private_directory(fs::path(path).parent_path(), ec))
      throw CacheFileError(CacheFileDefect::io_error, path, "its folder is missing or not a real directory");
    const size_t n = write_cache_bytes(path, image, durable_);
    std::lock_guard lock(mu_);
    ++writes_;
    bytes_written_ += n;
    return n;
  } catch (const CacheFileError&) {
    std::lock_guard lock(mu_);
    ++write_errors_;
    throw;
  }
}

bool DiskTier::remove(const std::string& id) {
  const std::string path = path_for(id);
  if (!is_real_directory(fs::path(path).parent_path())) return false;
  {
    std::lock_guard lock(mu_);
    memo_.erase(id);
  }
  std::error_code ec;
  bool removed = fs::remove(path, ec);
  removed |= fs::remove(path + kCorruptExt, ec);
  return removed;
}

std::optional<size_t> DiskTier::stored_bytes(const std::string& id) const {
  std::error_code ec;
  const auto bytes = fs::file_size(path_for(id), ec);
  if (ec) return std::nullopt;
  return static_cast<size_t>(bytes);
}

void DiskTier::describe(const std::string& id, ChunkTiers& t) const {
  const std::string path = path_for(id);
  struct stat st {};
  t.disk = ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);  // never through a link
  if (!t.disk) {
    std::lock_guard lock(mu_);
    memo_.erase(id);
    return;
  }
  if (t.memory) return;
  HeaderMemo seen{st.st_ino, st.st_size, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec,
                  int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec, {}};
  {
    std::lock_guard lock(mu_);
    auto it = memo_.find(id);
    if (it != memo_.end() && it->second.ino == seen.ino && it->second.size == seen.size &&
        it->second.mtime_ns == seen.mtime_ns && it->second.ctime_ns == seen.ctime_ns) {
      t.extra = it->second.extra;
      return;
    }
    ++header_reads_;
  }
  try {
    t.extra = read_cache_file_info(path).extra;
    seen.extra = t.extra;
    std::lock_guard lock(mu_);
    memo_[id] = std::move(seen);
  } catch (const std::exception&) {  // a bad file is reported when it is loaded
  }
}

void DiskTier::add_stats(ChunkStoreStats& s, uint64_t hits) const {
  std::lock_guard lock(mu_);
  s.disk_hits += hits;
  s.disk_loads += loads_;
  s.disk_bytes_read += bytes_read_;
  s.disk_writes += writes_;
  s.disk_header_reads += header_reads_;
  s.disk_write_errors += write_errors_;
  s.disk_bytes_written += bytes_written_;
  s.corrupt_files += corrupt_;
  s.foreign_files += foreign_;
  s.unauthenticated_files += unauthenticated_;
}

std::vector<StoredEntry> DiskTier::scan() const {
  struct Found {
    StoredEntry entry;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  for_each_file(dir_, [&](const fs::path& p, FileKind kind) {
    if (kind != FileKind::cache) return;
    std::error_code ec;
    const auto bytes = fs::file_size(p, ec);
    const auto mtime = fs::last_write_time(p, ec);
    if (!ec) found.push_back({{p.stem().string(), static_cast<size_t>(bytes)}, mtime});
  });
  // Recency of files from earlier runs: their write order.
  std::stable_sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  std::vector<StoredEntry> out;
  for (auto& f : found) out.push_back(std::move(f.entry));
  return out;
}

void DiskTier::list(std::vector<ChunkListEntry>& out) const {
  for_each_file(dir_, [&](const fs::path& p, FileKind kind) {
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
}

void DiskTier::verify(VerifyReport& r, const CacheFileExpect& base) const {
  for_each_file(dir_, [&](const fs::path& p, FileKind kind) {
    if (kind == FileKind::corrupt) ++r.corrupt_aside;
    if (kind == FileKind::temp) ++r.temp_files;
    if (kind != FileKind::cache) return;
    CacheFileExpect expect = base;
    expect.key_id = p.stem().string();
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
}

size_t DiskTier::remove_all() {
  {
    std::lock_guard lock(mu_);
    memo_.clear();
  }
  size_t n = 0;
  for_each_file(dir_, [&](const fs::path& p, FileKind kind) {
    if (kind == FileKind::other) return;
    std::error_code ec;
    if (fs::remove(p, ec) && kind == FileKind::cache) ++n;
  });
  std::error_code ec;
  if (fs::is_directory(dir_, ec))
    for (const auto& sub : fs::directory_iterator(dir_, ec))
      if (sub.path().filename().string().size() == 2 && is_real_directory(sub.path()) && fs::is_empty(sub.path(), ec))
        fs::remove(sub.path(), ec);
  return n;
}

}  // namespace cf

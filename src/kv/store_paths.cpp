// Store containment helpers (see store_paths.h).
#include "kv/store_paths.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace cf {

namespace fs = std::filesystem;

bool is_real_directory(const fs::path& p) {
  std::error_code ec;
  return fs::symlink_status(p, ec).type() == fs::file_type::directory;
}

bool is_real_file(const fs::path& p) {
  std::error_code ec;
  return fs::symlink_status(p, ec).type() == fs::file_type::regular;
}

void create_private_directories(const fs::path& dir, std::error_code& ec) {
  // Only a folder made here turns private: an existing one (a user's --cache-dir) keeps the
  // mode its owner gave it.
  const bool existed = fs::exists(fs::symlink_status(dir, ec));
  ec.clear();
  fs::create_directories(dir, ec);
  if (!ec && !existed) fs::permissions(dir, kPrivateDirPerms, fs::perm_options::replace, ec);
}

void create_private_directories(const fs::path& dir) {
  std::error_code ec;
  create_private_directories(dir, ec);
  if (ec) throw fs::filesystem_error("cannot create the directory", dir, ec);
}

bool ensure_private_directory(const fs::path& dir, std::error_code& ec) {
  create_private_directories(dir, ec);
  if (ec) return false;
  if (is_real_directory(dir)) return true;
  ec = std::make_error_code(std::errc::not_a_directory);  // a symlink (or a file) where our folder belongs
  return false;
}

size_t write_private_file_atomic(const fs::path& path, const void* data, size_t n, bool durable) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const size_t total = n;
  // A name no other writer (process or thread) can pick: pid plus 64 random bits.
  static thread_local std::mt19937_64 rng{std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32)};
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".tmp.%d.%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(rng()));
  std::string tmp_name = ".";  // appended, not operator+: GCC 12 warns falsely (-Wrestrict) on that
  tmp_name.append(path.filename().string()).append(suffix);
  const std::string tmp = (dir / tmp_name).string();
  // std::system_error keeps errno, so a caller can tell a full disk (ENOSPC) from other faults.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, kPrivateFileMode);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot create " + tmp);
  std::string error;
  int code = 0;
  auto fail = [&](std::string what) {
    code = errno != 0 ? errno : EIO;  // write(2) of 0 bytes sets none
    error = std::move(what);
  };
  for (auto* p = static_cast<const uint8_t*>(data); error.empty() && n > 0;) {
    errno = 0;
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write");
    else p += w, n -= static_cast<size_t>(w);
  }
  if (error.empty() && durable && ::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0 && error.empty()) fail("close");
  if (error.empty() && ::rename(tmp.c_str(), path.c_str()) != 0) fail("rename to " + path.string());
  if (!error.empty()) {
    ::unlink(tmp.c_str());
    throw std::system_error(code, std::generic_category(), "writing " + tmp + ": " + error);
  }
  // The rename is durable only once the directory entry is on disk.
  const int dfd = durable ? ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return total;
}

int private_temp_file_pid(std::string_view name) {
  constexpr std::string_view kTmp = ".tmp.";
  constexpr size_t kHex = 16;
  const size_t at = name.rfind(kTmp);
  if (name.size() < 2 || name[0] != '.' || at == std::string_view::npos || at < 2) return -1;
  const std::string_view rest = name.substr(at + kTmp.size());  // "<pid>.<16 hex>"
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 9 || rest.size() - dot - 1 != kHex) return -1;
  int pid = 0;
  for (const char c : rest.substr(0, dot)) {
    if (c < '0' || c > '9') return -1;
    pid = pid * 10 + (c - '0');
  }
  for (const char c : rest.substr(dot + 1))
    if (!std::isxdigit(static_cast<unsigned char>(c)) || std::isupper(static_cast<unsigned char>(c))) return -1;
  return pid;
}

namespace {

// A temp file of ours whose writer is gone (see remove_stale_temp_files).
bool stale_temp_file(const fs::path& p, fs::file_time_type started) {
  const int pid = private_temp_file_pid(p.filename().string());
  if (pid <= 0 || !is_real_file(p)) return false;
  std::error_code ec;
  const auto written = fs::last_write_time(p, ec);
  if (ec || written >= started) return false;
  const bool writer_alive = pid != ::getpid() && (::kill(pid, 0) == 0 || errno == EPERM);
  return !writer_alive;
}

}  // namespace

size_t remove_stale_temp_files(const fs::path& dir, fs::file_time_type started) {
  if (!is_real_directory(dir)) return 0;
  std::vector<fs::path> folders{dir};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_real_directory(e.path())) folders.push_back(e.path());
  size_t removed = 0;
  for (const auto& folder : folders)
    for (const auto& e : fs::directory_iterator(folder, ec))
      if (stale_temp_file(e.path(), started) && fs::remove(e.path(), ec)) ++removed;
  return removed;
}

void make_private_file(const fs::path& file) noexcept {
  std::error_code ec;
  fs::permissions(file, kPrivateFilePerms, fs::perm_options::replace, ec);
}

}  // namespace cf

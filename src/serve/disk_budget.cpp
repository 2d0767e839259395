// The disk tier's default budget (see disk_budget.h).
#include "serve/disk_budget.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>

namespace cf {

namespace fs = std::filesystem;

size_t default_disk_budget(uint64_t free_bytes, uint64_t store_bytes) {
  const uint64_t half = (free_bytes + store_bytes) / 2;
  return static_cast<size_t>(std::clamp<uint64_t>(half, kDefaultDiskBudgetFloor, kDefaultDiskBudgetCap));
}

namespace {

uint64_t bytes_under(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) total += it->file_size(ec);
  return total;
}

}  // namespace

size_t default_disk_budget(const std::string& dir) {
  struct statvfs fsinfo {};
  if (::statvfs(dir.c_str(), &fsinfo) != 0) return kDefaultDiskBudgetCap;
  const uint64_t free_bytes = static_cast<uint64_t>(fsinfo.f_bavail) * fsinfo.f_frsize;
  return default_disk_budget(free_bytes, bytes_under(dir));
}

}  // namespace cf

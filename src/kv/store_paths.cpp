// Store containment helpers (see store_paths.h).
#include "kv/store_paths.h"

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

void make_private_file(const fs::path& file) noexcept {
  std::error_code ec;
  fs::permissions(file, kPrivateFilePerms, fs::perm_options::replace, ec);
}

}  // namespace cf

// Keeping the chunk store inside its folder (issue 17, item 4): the store walks, reads and
// deletes only real directories and regular files under its root, never through a symlink
// (a link planted in the store could otherwise point `chunkfuse chunks rm --all` at any
// folder the user can write), and what it creates is private to its owner: folders 0700,
// files 0600 (cache entries hold K/V computed from the documents; the serve index holds
// their text).
#pragma once
#include <cstddef>
#include <filesystem>
#include <string_view>
#include <system_error>

namespace cf {

inline constexpr std::filesystem::perms kPrivateDirPerms = std::filesystem::perms::owner_all;
inline constexpr std::filesystem::perms kPrivateFilePerms =
    std::filesystem::perms::owner_read | std::filesystem::perms::owner_write;
inline constexpr unsigned kPrivateFileMode = 0600;  // for open(2)

// A directory itself, not a symlink to one (lstat).
bool is_real_directory(const std::filesystem::path& p);
// A regular file itself, not a symlink to one.
bool is_real_file(const std::filesystem::path& p);

// create_directories, then 0700 on `dir` when this call created it.
void create_private_directories(const std::filesystem::path& dir, std::error_code& ec);
// The same, throwing std::filesystem::error as create_directories does.
void create_private_directories(const std::filesystem::path& dir);
// create_private_directories, then true only if `dir` is a real directory (a symlink planted
// where a folder of ours belongs is refused, never written through; issue 29 item 11). ec says
// why on false.
bool ensure_private_directory(const std::filesystem::path& dir, std::error_code& ec);
// Writes `data` to `path` atomically and privately, the one implementation every store file
// uses (cache entries, f_r scores, the server's chunk index; issue 29 item 11): a temp file
// ".<name>.tmp.<pid>.<random>" in the same folder created O_CREAT|O_EXCL|O_NOFOLLOW with mode
// 0600 (never an existing file or a planted link, never readable by others, whatever the
// umask), written, fsynced (durable), renamed over `path`, then the folder fsynced (durable).
// std::system_error (a std::runtime_error) naming the file, with errno as its code (ENOSPC: the
// disk is full), on failure; the temp file is removed. Returns n.
size_t write_private_file_atomic(const std::filesystem::path& path, const void* data, size_t n, bool durable = true);
inline size_t write_private_file_atomic(const std::filesystem::path& path, std::string_view text, bool durable = true) {
  return write_private_file_atomic(path, text.data(), text.size(), durable);
}
// The pid in a temp file name of write_private_file_atomic (".<name>.tmp.<pid>.<16 hex>"), or
// -1 when `filename` is not one.
int private_temp_file_pid(std::string_view filename);
// Removes the temp files write_private_file_atomic leaves when its process dies between create
// and rename (kill -9, a crash, power loss): only names of that pattern, only regular files
// (never a link), in `dir` and its real subfolders one level down (the disk tier's
// <id[0:2]>/), last written before `started` (this process's start-up), and only when the
// writer is gone: its pid is this process's (which did not exist then) or no live process's.
// A temp file of a live writer, another process on the same store, is kept. Returns how many
// were removed.
size_t remove_stale_temp_files(const std::filesystem::path& dir, std::filesystem::file_time_type started);
// 0600 on a file this process wrote (before it is renamed into place). Best effort: a file
// system without modes leaves it as it is.
void make_private_file(const std::filesystem::path& file) noexcept;

}  // namespace cf

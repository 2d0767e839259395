// The default budget of the server's disk tier (issue 59): without one, every fused request
// with new documents wrote cache files (megabytes each) until the file system was full.
//
// Half of what the store's file system could give the store at start-up (its free space plus
// what the store already holds, so that a restart does not shrink the budget by the store's own
// files), at most 10 GiB and at least 16 MiB (never 0, which means unbounded). `serve --disk-budget` overrides it (0: unbounded);
// past the budget the store deletes cache files as it always did with a budget set (least
// valuable first: kv/chunk_store.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace cf {

inline constexpr size_t kDefaultDiskBudgetCap = size_t{10} << 30;
inline constexpr size_t kDefaultDiskBudgetFloor = size_t{16} << 20;
// EngineOptions::chunk_disk_bytes's "not given": the default is computed at start-up.
inline constexpr size_t kDiskBudgetDefault = SIZE_MAX;

// The rule above, from the file system's free bytes and the store's own.
size_t default_disk_budget(uint64_t free_bytes, uint64_t store_bytes);
// The rule for the store folder `dir` now (statvfs; the regular files under it, links not
// followed). The cap when the file system cannot be asked.
size_t default_disk_budget(const std::string& dir);

}  // namespace cf

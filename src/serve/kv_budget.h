// One K/V budget (serve --kv-budget, issue 58 item 3) for the running requests and the cached
// K/V: the scheduler's reservations (a job admitted to prefill holds prompt + max_tokens of K/V
// until it finishes, SchedulerJob::kv_bytes) and the caches' entries (the prefix cache's blocks,
// the chunk store's memory tier), each cache charging its bytes through a KvAccount
// (kv/kv_account.h). The rule, as vLLM's one block pool has it:
//
//  - reservations + cached bytes never exceed the budget: a reservation or a charge that would
//    cross it is not taken.
//  - Cached K/V is evictable and uses whatever the reservations leave free. A job whose
//    reservation fits beside the other reservations but not beside the caches is admitted after
//    the caches give back the difference (try_reserve): the largest holder first, each in its own
//    eviction order (the prefix cache: least recently used leaf blocks; the chunk store's memory
//    tier: its policy's victims, LRU or Cache-Craft's f_r with ties to the least recent, demoted
//    to its disk tier, whose written-through file stays). Those bytes are
//    counted in admission_evicted_bytes. Only when the reservations alone leave too little does
//    the job wait, and then nothing is evicted for it.
//  - A reservation is never reduced while its job runs: no cache takes from it, and a job is
//    never preempted for a cache. A cache whose charge finds no room evicts its own entries to
//    make it, or keeps no copy; it never evicts another cache's.
//  - Each cache keeps its own flag (--prefix-cache-budget, --mem-budget) as an upper bound.
//
// What is counted is what the caches hold. A cache hands out immutable entries by shared_ptr
// (a chunk cache, a prefix block while it is copied): one evicted while a prefill still reads it
// is freed when that reader lets go, so the process may briefly hold it beyond the books.
// Budget 0: unbounded (reservations always fit; the caches are bound by their own caps only).
// Thread-safe; the lock is never held while a cache gives back, so a cache may charge and
// discharge from inside its own lock.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kv/kv_account.h"

namespace cf {

// A quarter of the machine's memory (at least 256 MiB): serve --kv-budget's default.
size_t default_kv_budget_bytes();
constexpr size_t kKvBudgetDefault = SIZE_MAX;  // EngineOptions' "not given", for the budget and the caps
// serve --kv-budget (kKvBudgetDefault: default_kv_budget_bytes()) and the caches' caps under it
// (--mem-budget, --prefix-cache-budget), resolved in place; returns the budget. A cap the user
// gave stays; the default is all of the budget (the budget binds), or with an unbounded budget
// (0) the cache's fixed default: 1 GiB for the memory tier, 256 MiB for the prefix cache.
size_t resolve_kv_budgets(size_t& budget, size_t& chunk_memory, size_t& prefix_cache);
// The start-up line that says them, with the K/V bytes a token costs on this model.
std::string kv_budget_line(size_t budget, size_t bytes_per_token, size_t chunk_memory, size_t prefix_cache);

class KvBudget {
 public:
  explicit KvBudget(size_t budget_bytes = 0);
  ~KvBudget();
  KvBudget(const KvBudget&) = delete;
  KvBudget& operator=(const KvBudget&) = delete;

  // A cache under the budget. give_back(n) evicts entries in its eviction order until n bytes
  // are freed or it holds none, discharging them from the account returned here, and returns the
  // bytes it freed. It is called without the budget's lock (the account stays valid as long as
  // the budget does).
  KvAccount& add_cache(std::string name, std::function<size_t(size_t)> give_back);

  // Admission of a job of `bytes`: true (reserved) when it fits beside the reservations, once
  // the caches have given back what it needs; false, nothing evicted, when it does not.
  bool try_reserve(size_t bytes);
  void release(size_t bytes);  // a reservation ends (its job finished or failed)

  size_t budget_bytes() const { return budget_; }
  size_t reserved_bytes() const;
  size_t cached_bytes() const;                        // charged by all the caches
  uint64_t admission_evicted_bytes() const { return admission_evicted_.load(); }
  uint64_t refused_charges() const { return refused_charges_.load(); }  // cache copies not kept for want of room

 private:
  struct Cache;
  bool fits_locked(size_t bytes) const;
  Cache* largest_locked(const std::vector<Cache*>& spent) const;

  const size_t budget_;
  mutable std::mutex mu_;
  size_t reserved_ = 0, cached_ = 0;  // mu_
  std::vector<std::unique_ptr<Cache>> caches_;
  std::atomic<uint64_t> admission_evicted_{0}, refused_charges_{0};
};

}  // namespace cf

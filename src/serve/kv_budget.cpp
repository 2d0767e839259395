#include "serve/kv_budget.h"

#include <unistd.h>

#include <algorithm>

#include "base/progress.h"

namespace cf {

size_t default_kv_budget_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const size_t total = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  return std::max(total / 4, size_t{256} << 20);
}

size_t resolve_kv_budgets(size_t& budget, size_t& chunk_memory, size_t& prefix_cache) {
  if (budget == kKvBudgetDefault) budget = default_kv_budget_bytes();
  if (chunk_memory == kKvBudgetDefault) chunk_memory = budget ? budget : size_t{1} << 30;
  if (prefix_cache == kKvBudgetDefault) prefix_cache = budget ? budget : size_t{256} << 20;
  return budget;
}

std::string kv_budget_line(size_t budget, size_t bytes_per_token, size_t chunk_memory, size_t prefix_cache) {
  auto bytes = [](size_t n) { return format_bytes(static_cast<double>(n)); };
  return "chunkfuse serve: K/V budget " + (budget ? bytes(budget) : std::string("unbounded")) +
         " for the running requests and the cached K/V together, " + std::to_string(bytes_per_token) +
         " bytes a token (prefix cache at most " + bytes(prefix_cache) + ", chunk memory tier at most " +
         bytes(chunk_memory) + "; --kv-budget sets it)";
}

struct KvBudget::Cache : KvAccount {
  KvBudget* owner = nullptr;
  std::string name;
  std::function<size_t(size_t)> give_back;
  size_t held = 0;  // owner->mu_

  bool try_charge(size_t bytes) override {
    std::lock_guard lock(owner->mu_);
    if (!owner->fits_locked(bytes)) {
      ++owner->refused_charges_;
      return false;
    }
    held += bytes;
    owner->cached_ += bytes;
    return true;
  }
  void discharge(size_t bytes) override {
    std::lock_guard lock(owner->mu_);
    bytes = std::min(bytes, held);
    held -= bytes;
    owner->cached_ -= bytes;
  }
};

KvBudget::KvBudget(size_t budget_bytes) : budget_(budget_bytes) {}
KvBudget::~KvBudget() = default;

KvAccount& KvBudget::add_cache(std::string name, std::function<size_t(size_t)> give_back) {
  auto c = std::make_unique<Cache>();
  c->owner = this;
  c->name = std::move(name);
  c->give_back = std::move(give_back);
  std::lock_guard lock(mu_);
  caches_.push_back(std::move(c));
  return *caches_.back();
}

bool KvBudget::fits_locked(size_t bytes) const { return !budget_ || reserved_ + cached_ + bytes <= budget_; }

KvBudget::Cache* KvBudget::largest_locked(const std::vector<Cache*>& spent) const {
  Cache* best = nullptr;
  for (const auto& c : caches_)
    if (c->held && std::find(spent.begin(), spent.end(), c.get()) == spent.end() && (!best || c->held > best->held))
      best = c.get();
  return best;
}

bool KvBudget::try_reserve(size_t bytes) {
  std::unique_lock lock(mu_);
  if (budget_ && reserved_ + bytes > budget_) return false;  // the reservations alone leave too little
  // The caches give back, largest first; one that frees nothing is not asked again (a cache
  // refilled meanwhile by another thread is asked again, up to the bound on rounds).
  std::vector<Cache*> spent;
  for (int round = 0; !fits_locked(bytes) && round < 64; ++round) {
    Cache* c = largest_locked(spent);
    if (!c) break;
    const size_t need = reserved_ + cached_ + bytes - budget_;
    lock.unlock();
    const size_t freed = c->give_back ? c->give_back(need) : 0;
    lock.lock();
    admission_evicted_ += freed;
    if (!freed) spent.push_back(c);
  }
  if (!fits_locked(bytes)) return false;
  reserved_ += bytes;
  return true;
}

void KvBudget::release(size_t bytes) {
  std::lock_guard lock(mu_);
  reserved_ -= std::min(bytes, reserved_);
}

size_t KvBudget::reserved_bytes() const {
  std::lock_guard lock(mu_);
  return reserved_;
}

size_t KvBudget::cached_bytes() const {
  std::lock_guard lock(mu_);
  return cached_;
}

}  // namespace cf

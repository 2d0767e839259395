// A cache's share of a K/V byte budget it shares with others (serve/kv_budget.h: one budget for
// the running requests' reservations, the prefix cache and the chunk store's memory tier).
// A cache charges the bytes of an entry before it keeps it and discharges them when the entry
// goes; a charge that finds no room is refused, and the cache then evicts its own entries or
// does without the copy. Implementations are thread-safe and never call back into the cache,
// so a cache may charge and discharge while it holds its own lock.
#pragma once
#include <cstddef>

namespace cf {

class KvAccount {
 public:
  virtual ~KvAccount() = default;
  virtual bool try_charge(size_t bytes) = 0;  // false: no room beside everything else under the budget
  virtual void discharge(size_t bytes) = 0;   // bytes charged before, given back
};

}  // namespace cf

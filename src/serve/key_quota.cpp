#include "serve/key_quota.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "serve/request.h"

namespace cf {

KeyQuota::KeyQuota(size_t max_texts) : max_texts_(max_texts) {
  if (max_texts == 0) throw std::invalid_argument("the per-key bound on chunk texts in flight must be at least 1");
}

KeyQuota::Hold::~Hold() {
  if (quota_) quota_->release(key_, texts_);
}

KeyQuota::Hold KeyQuota::acquire(int key, size_t texts) {
  std::lock_guard lk(mu_);
  const auto it = in_flight_.find(key);
  const size_t held = it == in_flight_.end() ? 0 : it->second;
  if (held + texts > max_texts_) {
    ++refused_;
    throw RequestError(429, "rate_limit_error",
                       std::to_string(texts) + " texts would put this key's chunk registrations in flight at " +
                           std::to_string(held + texts) + ", more than " + std::to_string(max_texts_) +
                           " (serve --max-key-chunk-texts); retry when its earlier registrations are done",
                       "input", "key_busy");
  }
  in_flight_[key] = held + texts;
  return Hold(this, key, texts);
}

void KeyQuota::release(int key, size_t texts) {
  std::lock_guard lk(mu_);
  const auto it = in_flight_.find(key);
  if (it == in_flight_.end()) return;
  it->second -= std::min(texts, it->second);
  if (it->second == 0) in_flight_.erase(it);
}

size_t KeyQuota::in_flight() const {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (const auto& [key, texts] : in_flight_) n += texts;
  return n;
}

size_t KeyQuota::in_flight(int key) const {
  std::lock_guard lk(mu_);
  const auto it = in_flight_.find(key);
  return it == in_flight_.end() ? 0 : it->second;
}

uint64_t KeyQuota::refused() const {
  std::lock_guard lk(mu_);
  return refused_;
}

}  // namespace cf

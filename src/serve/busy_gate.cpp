#include "serve/busy_gate.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "serve/request.h"

namespace cf {

namespace {

size_t resolve_capacity(size_t given) {
  if (given > 0) return given;
  return 2 * std::max<size_t>(1, std::thread::hardware_concurrency());
}

}  // namespace

BusyGate::BusyGate(size_t capacity, std::chrono::milliseconds max_wait, std::string work)
    : capacity_(resolve_capacity(capacity)), max_wait_(max_wait), work_(std::move(work)) {}

BusyGate::Slot::~Slot() {
  if (gate_) gate_->leave();
}

BusyGate::Slot BusyGate::enter() {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, max_wait_, [&] { return busy_ < capacity_; })) {
    ++refused_;
    throw RequestError(503, "server_error",
                       "server busy: " + std::to_string(capacity_) + " requests are " + work_ + " and none finished " +
                           "within " + std::to_string(max_wait_.count()) + " ms; retry later",
                       "", "server_busy");
  }
  ++busy_;
  return Slot(this);
}

void BusyGate::leave() {
  {
    std::lock_guard lk(mu_);
    --busy_;
  }
  cv_.notify_one();
}

size_t BusyGate::busy() const {
  std::lock_guard lk(mu_);
  return busy_;
}

uint64_t BusyGate::refused() const {
  std::lock_guard lk(mu_);
  return refused_;
}

}  // namespace cf

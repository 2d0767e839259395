// A cap on the requests that tokenize at once (issue 59): connection threads (up to
// --max-connections, 256) each tokenized their whole prompt before the scheduler's queue was
// even checked, so 256 large prompts could take every core and ~256 x their tokens of memory
// at once. Every place a request's text becomes tokens (the engine's prompt layout and chunk
// registration, knowledge-base uploads) holds a slot while it does; at most `capacity` slots
// are out, and a request that finds none free within `max_wait` is refused with 503
// `server_busy` (retry later). Thread-safe.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace cf {

class TokenizeGate {
 public:
  // capacity 0: 2 x the hardware threads.
  TokenizeGate(size_t capacity, std::chrono::milliseconds max_wait);
  TokenizeGate(const TokenizeGate&) = delete;
  TokenizeGate& operator=(const TokenizeGate&) = delete;

  // Held while tokenizing; released when it goes out of scope.
  class Slot {
   public:
    explicit Slot(TokenizeGate* gate) : gate_(gate) {}
    Slot(Slot&& o) noexcept : gate_(o.gate_) { o.gate_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    ~Slot();

   private:
    TokenizeGate* gate_;
  };
  // Waits up to max_wait for a free slot; RequestError 503 `server_busy` when none frees.
  Slot enter();

  size_t capacity() const { return capacity_; }
  size_t busy() const;
  uint64_t refused() const;  // requests refused with 503 since start

 private:
  void leave();

  const size_t capacity_;
  const std::chrono::milliseconds max_wait_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t busy_ = 0;
  uint64_t refused_ = 0;
};

}  // namespace cf

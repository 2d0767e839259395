// A cap on how many callers do one kind of costly work at once (issue 59): at most `capacity`
// slots are out; a caller that finds none free within `max_wait` is refused with 503 and
// `"code": "server_busy"` (retry later). Thread-safe.
//
// Used for tokenizing (the engine: connection threads, up to --max-connections, 256, each
// tokenized their whole prompt before the scheduler's queue was even checked, so 256 large
// prompts could take every core and their tokens' memory at once; prompt layout, chunk
// registration and knowledge-base uploads hold a slot while they tokenize) and for PDF
// extraction (the knowledge base: one `pdftotext` process per slot).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace cf {

class BusyGate {
 public:
  // capacity 0: 2 x the hardware threads. `work` names what a slot is for in the 503's
  // message ("tokenizing their prompts").
  BusyGate(size_t capacity, std::chrono::milliseconds max_wait, std::string work);
  BusyGate(const BusyGate&) = delete;
  BusyGate& operator=(const BusyGate&) = delete;

  // Held while working; released when it goes out of scope.
  class Slot {
   public:
    explicit Slot(BusyGate* gate) : gate_(gate) {}
    Slot(Slot&& o) noexcept : gate_(o.gate_) { o.gate_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    ~Slot();

   private:
    BusyGate* gate_;
  };
  // Waits up to max_wait for a free slot; RequestError 503 `server_busy` when none frees.
  Slot enter();

  size_t capacity() const { return capacity_; }
  size_t busy() const;
  uint64_t refused() const;  // callers refused with 503 since start

 private:
  void leave();

  const size_t capacity_;
  const std::chrono::milliseconds max_wait_;
  const std::string work_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t busy_ = 0;
  uint64_t refused_ = 0;
};

}  // namespace cf

// A per-key bound on chunk registration in flight (issue 58 item 4). POST /v1/chunks computes
// one chunk cache per text on the scheduler thread (a prefill each, cut into pieces), and a
// request may carry up to --max-chunk-texts texts; nothing stopped one client from sending many
// such requests at once and keeping the scheduler on its chunks while every other key's
// requests waited behind them. Each key (the index of its API key; a server without keys has
// one anonymous key that all its clients share) may have at most `max_texts` texts
// registering at once (serve --max-key-chunk-texts); a request that would pass it is answered
// 429 with code "key_busy" at once, before it tokenizes anything, and may retry when its
// earlier registrations are done. Thread-safe.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace cf {

class KeyQuota {
 public:
  explicit KeyQuota(size_t max_texts);
  KeyQuota(const KeyQuota&) = delete;
  KeyQuota& operator=(const KeyQuota&) = delete;

  // A key's texts in flight; released when it goes out of scope.
  class Hold {
   public:
    Hold(KeyQuota* quota, int key, size_t texts) : quota_(quota), key_(key), texts_(texts) {}
    Hold(Hold&& o) noexcept : quota_(o.quota_), key_(o.key_), texts_(o.texts_) { o.quota_ = nullptr; }
    Hold& operator=(Hold&&) = delete;
    ~Hold();

   private:
    KeyQuota* quota_;
    int key_;
    size_t texts_;
  };
  // Takes `texts` of key's quota; RequestError 429 "key_busy" when the key's texts in flight
  // plus these would pass max_texts.
  Hold acquire(int key, size_t texts);

  size_t max_texts() const { return max_texts_; }
  size_t in_flight() const;          // texts registering, every key together
  size_t in_flight(int key) const;   // one key's
  uint64_t refused() const;          // requests answered 429 since start

 private:
  void release(int key, size_t texts);

  const size_t max_texts_;
  mutable std::mutex mu_;
  std::map<int, size_t> in_flight_;  // keys with texts in flight only
  uint64_t refused_ = 0;
};

}  // namespace cf

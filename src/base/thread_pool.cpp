#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cf {
namespace {
inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}
// How long an idle worker spins before sleeping on the condition variable.
constexpr auto kSpinFor = std::chrono::microseconds(1000);

// The job word packs generation | task count | next task index, so that a task claim is
// one compare-and-swap that also proves the claim belongs to the current job. A worker
// that wakes late can never run a task of a job it did not see published.
constexpr int kIndexBits = 20, kCountBits = 20;
constexpr uint64_t kIndexMask = (uint64_t{1} << kIndexBits) - 1;
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
inline uint64_t gen_of(uint64_t w) { return w >> (kIndexBits + kCountBits); }
inline uint64_t count_of(uint64_t w) { return (w >> kIndexBits) & kCountMask; }
inline uint64_t index_of(uint64_t w) { return w & kIndexMask; }
inline uint64_t make_word(uint64_t gen, uint64_t count) { return (gen << (kIndexBits + kCountBits)) | (count << kIndexBits); }
}  // namespace

ThreadPool::ThreadPool(size_t n_threads) {
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  n_threads_ = n_threads;
  for (size_t i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

// Claims and runs tasks of generation `gen` until none is left; returns how many ran.
size_t ThreadPool::run_tasks(uint64_t gen, size_t thread_index) {
  size_t ran = 0;
  uint64_t w = job_word_.load(std::memory_order_acquire);
  for (;;) {
    if (gen_of(w) != gen || index_of(w) >= count_of(w)) return ran;
    if (!job_word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    (*job_)(index_of(w), thread_index);
    done_.fetch_add(1, std::memory_order_acq_rel);
    ++ran;
    w = job_word_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop(size_t thread_index) {
  uint64_t seen = 0;
  for (;;) {
    auto spin_until = std::chrono::steady_clock::now() + kSpinFor;
    int spins = 0;
    uint64_t gen;
    while ((gen = gen_of(job_word_.load(std::memory_order_acquire))) == seen) {
      if (stop_.load(std::memory_order_relaxed)) return;
      cpu_relax();
      if (++spins % 256 == 0) std::this_thread::yield();  // let a runnable thread have the core
      if (spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mutex_);
        ++sleepers_;
        wake_.wait(lock, [&] {
          return stop_.load() || gen_of(job_word_.load(std::memory_order_acquire)) != seen;
        });
        --sleepers_;
        spin_until = std::chrono::steady_clock::now() + kSpinFor;
      }
    }
    seen = gen;
    run_tasks(gen, thread_index);
  }
}

void ThreadPool::parallel_for(size_t n_tasks, const std::function<void(size_t, size_t)>& fn) {
  if (n_tasks == 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (size_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  if (n_tasks > kCountMask) {  // more tasks than the job word can count: run in slices
    for (size_t b = 0; b < n_tasks; b += kCountMask)
      parallel_for(std::min(kCountMask, n_tasks - b), [&](size_t t, size_t th) { fn(b + t, th); });
    return;
  }
  job_ = &fn;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = ++generation_;
  job_word_.store(make_word(gen, n_tasks), std::memory_order_release);
  {
    // Pairs with the sleeping workers' predicate check; skipped while all are spinning.
    std::lock_guard<std::mutex> lock(mutex_);
    if (sleepers_ > 0) wake_.notify_all();
  }
  run_tasks(gen, 0);
  // Every task is claimed; wait for the ones other threads are still running. A worker
  // that was descheduled before claiming anything is not waited for.
  // On a busy machine the thread we wait for may share our core: yield after a short spin.
  for (int spins = 0; done_.load(std::memory_order_acquire) != n_tasks; ++spins) {
    if (spins < 4096) cpu_relax();
    else std::this_thread::yield();
  }
  job_ = nullptr;
}

void ThreadPool::parallel_range(size_t n, const std::function<void(size_t, size_t, size_t)>& fn,
                                size_t chunks_per_thread) {
  if (n == 0) return;
  size_t chunks = std::min(n, std::max<size_t>(1, n_threads_ * chunks_per_thread));
  size_t per = (n + chunks - 1) / chunks;
  chunks = (n + per - 1) / per;
  parallel_for(chunks, [&](size_t c, size_t thread) {
    size_t b = c * per, e = std::min(n, b + per);
    fn(b, e, thread);
  });
}

}  // namespace cf

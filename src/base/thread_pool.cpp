#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>

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
constexpr auto kSpinFor = std::chrono::microseconds(2000);
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
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_tasks(size_t thread_index) {
  for (;;) {
    size_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (t >= job_tasks_) break;
    (*job_)(t, thread_index);
  }
}

void ThreadPool::worker_loop(size_t thread_index) {
  uint64_t seen = 0;
  for (;;) {
    auto spin_until = std::chrono::steady_clock::now() + kSpinFor;
    uint64_t gen;
    int spins = 0;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
      cpu_relax();
      if (++spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
    }
    seen = gen;
    if (stop_.load()) return;
    run_tasks(thread_index);
    pending_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(size_t n_tasks, const std::function<void(size_t, size_t)>& fn) {
  if (n_tasks == 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (size_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  job_ = &fn;
  job_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  pending_workers_.store(workers_.size(), std::memory_order_relaxed);
  {
    // Publishing under the mutex pairs with the sleeping workers' predicate check.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  run_tasks(0);
  while (pending_workers_.load(std::memory_order_acquire) != 0) cpu_relax();
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

// A fixed pool of worker threads for data-parallel loops. The calling thread takes part,
// so a pool of N threads starts N-1 workers. Workers spin briefly before sleeping: the
// forward pass issues hundreds of short parallel loops per token.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cf {

class ThreadPool {
 public:
  // n_threads == 0: one per hardware thread.
  explicit ThreadPool(size_t n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return n_threads_; }

  // Runs fn(task, thread) for task in [0, n_tasks), tasks handed out dynamically; blocks
  // until all are done. `thread` is in [0, size()) and identifies per-thread scratch.
  // Not reentrant: fn must not call parallel_for on the same pool.
  void parallel_for(size_t n_tasks, const std::function<void(size_t task, size_t thread)>& fn);

  // Splits [0, n) into about `size() * chunks_per_thread` contiguous ranges and runs
  // fn(begin, end, thread) on each.
  void parallel_range(size_t n, const std::function<void(size_t begin, size_t end, size_t thread)>& fn,
                      size_t chunks_per_thread = 4);

 private:
  void worker_loop(size_t thread_index);
  size_t run_tasks(uint64_t gen, size_t thread_index);

  size_t n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  uint64_t generation_ = 0;              // caller side only
  std::atomic<uint64_t> job_word_{0};    // generation | task count | next index
  std::atomic<size_t> done_{0};          // tasks of the current job finished
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  int sleepers_ = 0;                     // guarded by mutex_
};

}  // namespace cf

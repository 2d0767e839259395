#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "base/thread_pool.h"

namespace cf {
namespace {

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  for (size_t threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int round = 0; round < 200; ++round) {
      std::vector<std::atomic<int>> hits(97);
      pool.parallel_for(hits.size(), [&](size_t t, size_t thread) {
        ASSERT_LT(thread, threads);
        hits[t].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, RangesCoverWithoutOverlap) {
  ThreadPool pool(3);
  for (size_t n : {0, 1, 2, 7, 1000}) {
    std::vector<int> seen(n, 0);
    pool.parallel_range(n, [&](size_t b, size_t e, size_t) {
      for (size_t i = b; i < e; ++i) seen[i] += 1;
    });
    for (int s : seen) EXPECT_EQ(s, 1);
  }
}

TEST(ThreadPool, SleepsAndWakesUp) {
  ThreadPool pool(2);
  std::atomic<int> sum{0};
  pool.parallel_for(4, [&](size_t t, size_t) { sum += static_cast<int>(t); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // workers go to sleep
  pool.parallel_for(4, [&](size_t t, size_t) { sum += static_cast<int>(t); });
  EXPECT_EQ(sum.load(), 12);
}

}  // namespace
}  // namespace cf

// The sanitizer build compiles the ISA kernels without ASan (base/sanitizer.h); their callers
// check each call's regions instead. These tests hand each caller a buffer one element too
// short and expect ASan's report at the call, naming the region. They exist only in builds
// with ASan (CI's sanitizer phase runs them); elsewhere such a call is undefined behaviour.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "base/sanitizer.h"
#include "base/thread_pool.h"
#include "model/kernels.h"
#include "runtime/attention.h"
#include "runtime/vector_math.h"

#ifdef CF_ASAN
namespace cf {
namespace {

// Forked death tests re-run the test binary: the thread pools are made in the child.
class KernelRegionChecks : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(KernelRegionChecks, ElementwiseKernelsReportAShortBuffer) {
  std::vector<float> x(64, 1.f), w(64, 1.f), y(63);
  EXPECT_DEATH(rms_norm(x.data(), w.data(), y.data(), 64, 1e-6f),
               "rms_norm y: byte 252 of the 256-byte region(.|\n)*heap-buffer-overflow");
  rms_norm(x.data(), w.data(), x.data(), 64, 1e-6f);  // whole buffers: no report
  std::vector<uint16_t> bits(63);
  EXPECT_DEATH(f32_to_f16(x.data(), bits.data(), 64), "f32_to_f16 y(.|\n)*heap-buffer-overflow");
}

TEST_F(KernelRegionChecks, WeightMatmulReportsAShortOutputRow) {
  // Q8_0, 32 rows x 64 columns of zero-scale blocks (34 bytes per 32 weights).
  const size_t rows = 32, cols = 64;
  std::vector<uint8_t> w(rows * cols / 32 * 34, 0);
  WeightMatrix m(GgmlType::Q8_0, w.data(), rows, cols);
  std::vector<float> x(2 * cols, 0.5f), y(2 * rows);
  ThreadPool pool(1);
  m.multiply(x.data(), 2, cols, y.data(), rows, pool);  // whole buffers: no report
  std::vector<float> y_short(2 * rows - 1);
  EXPECT_DEATH(m.multiply(x.data(), 2, cols, y_short.data(), rows, pool),
               "matmul output row(.|\n)*heap-buffer-overflow");
  std::vector<float> x_short(2 * cols - 1, 0.5f);
  EXPECT_DEATH(m.multiply(x_short.data(), 2, cols, y.data(), rows, pool),
               "matmul input row(.|\n)*heap-buffer-overflow");
}

TEST_F(KernelRegionChecks, AttentionReportsAShortKvCache) {
  const AttentionShape s{2, 1, 16};
  const size_t n_entries = 4;
  std::vector<float> q(2 * 16, 0.1f), out(2 * 16);
  std::vector<uint16_t> K(n_entries * 16, 0), V(n_entries * 16, 0), K_short(n_entries * 16 - 1, 0);
  const std::vector<int32_t> row_pos{4}, entry_pos{0, 1, 2, 3};
  ThreadPool pool(1);
  attention(s, q.data(), row_pos.data(), 1, K.data(), V.data(), entry_pos.data(), n_entries, out.data(), pool);
  EXPECT_DEATH(attention(s, q.data(), row_pos.data(), 1, K_short.data(), V.data(), entry_pos.data(), n_entries,
                         out.data(), pool),
               "attention K(.|\n)*heap-buffer-overflow");
  std::vector<float> probs(2 * n_entries - 1);
  EXPECT_DEATH(attention_probs(s, q.data(), 4, K.data(), entry_pos.data(), n_entries, probs.data()),
               "attention_probs probs(.|\n)*heap-buffer-overflow");
}

}  // namespace
}  // namespace cf
#endif

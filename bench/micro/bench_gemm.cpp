// GEMM throughput on the default model's shapes (Q4_1 layer matrices, Q8_0 output) and on
// Llama-3.2-1B's (Q4_K / Q6_K, the types of a Q4_K_M file).
// Reports GMAC/s as the "MAC/s" counter. Args: rows, cols, n (activation rows), threads.
// CHUNKFUSE_ISA=portable|avx2|avx512 caps the ISA.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "model/kernels.h"

namespace {

std::vector<uint8_t> random_weights(cf::GgmlType t, size_t rows, size_t cols) {
  std::mt19937 rng(1);
  std::vector<uint8_t> w(cf::ggml_row_bytes(t, cols) * rows);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const size_t bb = cf::ggml_type_info(t).block_bytes;
  for (size_t i = 0; i < w.size(); i += bb) {
    const uint16_t d = cf::fp32_to_fp16(0.01f), m = cf::fp32_to_fp16(-0.05f);
    if (t != cf::GgmlType::Q6_K) std::memcpy(&w[i], &d, 2);
    if (t == cf::GgmlType::Q4_1 || t == cf::GgmlType::Q4_K) std::memcpy(&w[i + 2], &m, 2);  // d, m / dmin
    if (t == cf::GgmlType::Q6_K) std::memcpy(&w[i + bb - 2], &d, 2);  // d last
  }
  return w;
}

void run(benchmark::State& state, cf::GgmlType t) {
  const size_t rows = state.range(0), cols = state.range(1), n = state.range(2), threads = state.range(3);
  const auto w = random_weights(t, rows, cols);
  cf::WeightMatrix m(t, w.data(), rows, cols);
  std::vector<float> x(n * cols), y(n * rows);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  cf::ThreadPool pool(threads);
  for (auto _ : state) {
    m.multiply(x.data(), n, cols, y.data(), rows, pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["MAC/s"] = benchmark::Counter(static_cast<double>(rows * cols * n), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(cf::isa_name(cf::active_isa()));
}

void q4_1(benchmark::State& s) { run(s, cf::GgmlType::Q4_1); }
void q8_0(benchmark::State& s) { run(s, cf::GgmlType::Q8_0); }
void q4_0(benchmark::State& s) { run(s, cf::GgmlType::Q4_0); }
void q5_0(benchmark::State& s) { run(s, cf::GgmlType::Q5_0); }
void q4_k(benchmark::State& s) { run(s, cf::GgmlType::Q4_K); }
void q6_k(benchmark::State& s) { run(s, cf::GgmlType::Q6_K); }

// Llama-3.2-1B: attention (2048 x 2048) and MLP (8192 x 2048) matrices, decode and prefill.
void llama_1b_shapes(benchmark::internal::Benchmark* b) {
  for (int n : {1, 512})
    for (auto [rows, cols] : {std::pair{2048, 2048}, {8192, 2048}}) b->Args({rows, cols, n, 1});
}

// Qwen2.5-0.5B (d 896, MLP 4864): its Q5_0 / Q8_0 / Q4_0 attention and MLP-in matrices and
// its K-quant MLP-out (4864 wide), decode and prefill (issue 28).
void qwen_shapes(benchmark::internal::Benchmark* b) {
  for (int n : {1, 512})
    for (auto [rows, cols] : {std::pair{896, 896}, {4864, 896}}) b->Args({rows, cols, n, 1});
}
void qwen_down_shapes(benchmark::internal::Benchmark* b) {
  for (int n : {1, 512}) b->Args({896, 4864, n, 1});
}
// Qwen2.5-1.5B (d 1536, MLP 8960): its Q4_K attention and MLP-in matrices, its Q6_K MLP-out.
void qwen15_shapes(benchmark::internal::Benchmark* b) {
  for (int n : {1, 512})
    for (auto [rows, cols] : {std::pair{1536, 1536}, {8960, 1536}}) b->Args({rows, cols, n, 1});
}
void qwen15_down_shapes(benchmark::internal::Benchmark* b) {
  for (int n : {1, 512}) b->Args({1536, 8960, n, 1});
}
void layer_shapes(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int n : {1, 64, 512, 2048})
      for (auto [rows, cols] : {std::pair{576, 576}, {192, 576}, {1536, 576}, {576, 1536}})
        b->Args({rows, cols, n, threads});
}

}  // namespace

BENCHMARK(q4_1)->Apply(layer_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q8_0)->Args({49152, 576, 1, 1})->Args({49152, 576, 1, 2})->Args({49152, 576, 16, 2})
    ->UseRealTime()->MinTime(0.2);
BENCHMARK(q5_0)->Apply(qwen_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q4_0)->Apply(qwen_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q8_0)->Apply(qwen_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q4_1)->Apply(qwen_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q4_k)->Apply(qwen_down_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q6_k)->Apply(qwen_down_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q4_k)->Apply(llama_1b_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q4_k)->Apply(qwen15_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q6_k)->Apply(qwen15_down_shapes)->UseRealTime()->MinTime(0.2);
BENCHMARK(q6_k)->Apply(llama_1b_shapes)->UseRealTime()->MinTime(0.2);
// Decode through Llama-3.2-1B's tied output matrix (Q6_K in its Q4_K_M file, 128256 x 2048,
// larger than any cache): a memory-bound GEMV, where the stored bytes per weight decide.
BENCHMARK(q6_k)->Args({128256, 2048, 1, 2})->UseRealTime()->MinTime(1.0);
// Decode as a model runs it: the other matrices above fit in this machine's 32 MiB L3, a
// model's layers together do not, so these stream from memory like a token's GEMVs
// (Qwen2.5 1.5B's and 0.5B's widths; issue 28).
BENCHMARK(q4_k)->Args({65536, 1536, 1, 1})->UseRealTime()->MinTime(0.5);
BENCHMARK(q6_k)->Args({65536, 1536, 1, 1})->UseRealTime()->MinTime(0.5);
BENCHMARK(q5_0)->Args({65536, 896, 1, 1})->UseRealTime()->MinTime(0.5);
BENCHMARK(q8_0)->Args({65536, 896, 1, 1})->UseRealTime()->MinTime(0.5);
BENCHMARK(q4_0)->Args({65536, 576, 1, 1})->UseRealTime()->MinTime(0.5);
BENCHMARK_MAIN();

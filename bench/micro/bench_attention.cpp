// Batched attention throughput (the prefill's causal attention: `rows` query rows at the last
// positions of a cache of `entries` f16 entries), on the real files' head shapes. Reports
// the Q.K and P.V multiply-adds of the visible (row, entry) pairs a second as "MAC/s".
// Args: n_heads, n_kv_heads, head_dim, rows, entries, threads. CHUNKFUSE_ISA caps the ISA.
// "CPU" is the process's CPU time (both threads): on a shared machine MACs over it compare
// kernels better than the wall-clock rate.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "model/kernels.h"
#include "runtime/attention.h"

namespace {

void causal(benchmark::State& state) {
  const int heads = static_cast<int>(state.range(0)), kv_heads = static_cast<int>(state.range(1));
  const int hd = static_cast<int>(state.range(2));
  const size_t rows = state.range(3), entries = state.range(4), threads = state.range(5);
  const cf::AttentionShape s{heads, kv_heads, hd};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> q(rows * heads * hd), out(q.size());
  for (auto& v : q) v = nd(rng);
  std::vector<uint16_t> K(entries * kv_heads * hd), V(K.size());
  for (auto& v : K) v = cf::fp32_to_fp16(nd(rng));
  for (auto& v : V) v = cf::fp32_to_fp16(nd(rng));
  std::vector<int32_t> entry_pos(entries), row_pos(rows);
  for (size_t e = 0; e < entries; ++e) entry_pos[e] = static_cast<int32_t>(e);
  double pairs = 0;
  for (size_t r = 0; r < rows; ++r) {
    row_pos[r] = static_cast<int32_t>(entries - rows + r);
    pairs += row_pos[r] + 1;
  }
  cf::ThreadPool pool(threads);
  for (auto _ : state) {
    cf::attention(s, q.data(), row_pos.data(), rows, K.data(), V.data(), entry_pos.data(), entries, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["MAC/s"] = benchmark::Counter(pairs * heads * hd * 2, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(cf::isa_name(cf::active_isa()));
}

// Qwen2.5 1.5B (12 / 2 heads of 128) and 0.5B (14 / 2 of 64), SmolLM2 (9 / 3 of 64), Gemma 3
// 270M (4 / 1 of 256): a 512-row prefill piece at the end of 512 and 2048 entries.
void shapes(benchmark::internal::Benchmark* b) {
  for (auto [h, kv, hd] : {std::tuple{12, 2, 128}, {14, 2, 64}, {9, 3, 64}, {4, 1, 256}})
    for (int entries : {512, 2048}) b->Args({h, kv, hd, 512, entries, 2});
}

}  // namespace

BENCHMARK(causal)->Apply(shapes)->MeasureProcessCPUTime()->UseRealTime()->MinTime(0.5);
BENCHMARK_MAIN();

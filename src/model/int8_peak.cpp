#include "model/int8_peak.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace cf {

namespace {
using PeakLoop = double (*)(long iterations, int& checksum);

double one_run(PeakLoop loop, size_t threads, long iterations) {
  // Plain threads, one loop each: a pool may hand both loops to one worker that woke first.
  std::vector<double> macs(threads, 0.0);
  std::vector<int> sink(threads, 0);
  std::vector<std::thread> workers;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < threads; ++i)
    workers.emplace_back([&, i] {
      macs[i] = loop(iterations, sink[i]);
    });
  for (auto& w : workers) w.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double total = 0;
  for (double m : macs) total += m;
  return s > 0 ? total / s : 0.0;
}
// The best of several short runs: on a shared machine a run can lose its core for a while,
// and the peak is what the silicon does when it has it.
double best_of(PeakLoop loop, size_t threads, long iterations, int runs) {
  double best = 0;
  for (int i = 0; i < runs; ++i) best = std::max(best, one_run(loop, threads, iterations));
  return best;
}
}  // namespace

double int8_peak_macs_per_s(Isa isa, size_t threads, long iterations, int runs) {
  if (isa == Isa::Portable || isa > detect_isa() || threads == 0) return 0.0;
  const PeakLoop loop = isa == Isa::Amx      ? kern::int8_peak_loop_amx
                        : isa == Isa::Avx512 ? kern::int8_peak_loop_avx512
                                             : kern::int8_peak_loop_avx2;
  return best_of(loop, threads, iterations, runs);
}

double amx_bf16_peak_macs_per_s(size_t threads, long iterations, int runs) {
  if (detect_isa() < Isa::Amx || threads == 0) return 0.0;
  return best_of(kern::bf16_peak_loop_amx, threads, iterations, runs);
}

double read_bandwidth_bytes_per_s(size_t threads, size_t bytes, int runs) {
  if (threads == 0) return 0.0;
  const size_t part = bytes / threads / 64 * 64;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(64, part * threads));
  if (!buf) return 0.0;
  std::memset(buf, 1, part * threads);  // touched: the pages exist before the timed reads
  const bool avx2 = detect_isa() >= Isa::Avx2;
  std::vector<uint64_t> sink(threads, 0);
  double best = 0;
  for (int run = 0; run < runs; ++run) {
    std::vector<std::thread> workers;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < threads; ++i)
      workers.emplace_back([&, i] {
        const uint8_t* p = buf + i * part;
        if (avx2) {
          sink[i] += kern::read_sum_avx2(p, part);
        } else {
          uint64_t s = 0;
          for (size_t k = 0; k < part; k += 8) {
            uint64_t v;
            std::memcpy(&v, p + k, 8);
            s += v;
          }
          sink[i] += s;
        }
      });
    for (auto& w : workers) w.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(part * threads) / s);
  }
  std::free(buf);
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep + v;
  return best;
}

}  // namespace cf

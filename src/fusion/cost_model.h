// This machine's price of a prefill, for the auto policy's latency budget (fusion.ttft_ms,
// issue 60 item 1; fusion/auto_quality.h walks with it). A pass costs
//   ms = fixed_ms + rows x layers x ms_per_row_layer,
// rows being what the forward pass runs: the recomputed context rows and the suffix, plus the
// tokens of cold chunk caches computed first. Attention's growth with the context and chunk
// loads from the disk or remote tier are not in it (a prefetched load costs milliseconds); the
// refresh from served prefills absorbs what the two terms miss on average.
#pragma once
#include <cstddef>
#include <mutex>

#include "runtime/forward.h"

namespace cf::autoq {

struct CostModel {
  double fixed_ms = 0;          // a pass's cost beyond its rows (measured with one row)
  double ms_per_row_layer = 0;  // measured, then refreshed
  size_t layers = 1;
  size_t observations = 0;      // served prefills it was refreshed from
  double predict_ms(double rows) const { return fixed_ms + rows * static_cast<double>(layers) * ms_per_row_layer; }
  // A served prefill of `rows` rows took `ms`: the per-row price moves to what it showed by an
  // exponential average of weight kRefreshWeight (recent load on a shared machine counts most).
  void observe(double rows, double ms);
  static constexpr double kRefreshWeight = 0.2;
};

// Two timed passes on a scratch cache, one row then kMeasureRows: well under a second on the
// models here (Qwen 0.5B, 2 threads: about 0.3 s).
inline constexpr size_t kMeasureRows = 64;
CostModel measure_cost_model(Forward& fwd);

// The process's cost model of one model (on the first forward pass that asked: a process runs
// one thread pool): measured on first use (the engine asks at start-up when serve --ttft-ms is
// set), then refreshed from served prefills; thread-safe.
class SharedCostModel {
 public:
  explicit SharedCostModel(CostModel m) : m_(m) {}
  CostModel get() const;
  void observe(double rows, double ms);

 private:
  mutable std::mutex mu_;
  CostModel m_;
};
SharedCostModel& shared_cost_model(Forward& fwd);

}  // namespace cf::autoq

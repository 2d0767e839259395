#include "fusion/cost_model.h"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "base/clock.h"
#include "model/model.h"
#include "runtime/kv_cache.h"

namespace cf::autoq {

void CostModel::observe(double rows, double ms) {
  if (!(rows > 0) || !(ms >= 0)) return;
  const double per_row_layer = std::max(ms - fixed_ms, 0.0) / (rows * static_cast<double>(layers));
  ms_per_row_layer = (1 - kRefreshWeight) * ms_per_row_layer + kRefreshWeight * per_row_layer;
  ++observations;
}

namespace {
double timed_pass(Forward& fwd, size_t rows) {
  const ModelHparams& h = fwd.model().hparams();
  KvCache kv(h, rows);
  // Any valid ids: the price does not depend on which tokens run.
  std::vector<TokenId> tokens(rows, static_cast<TokenId>(std::min(h.vocab_size - 1, 100)));
  std::vector<int32_t> pos(rows);
  for (size_t i = 0; i < rows; ++i) pos[i] = static_cast<int32_t>(i);
  const size_t last = rows - 1;
  const auto t0 = SteadyClock::now();
  fwd.run(kv, {tokens, pos, {}, std::span<const size_t>(&last, 1)});
  return ms_since(t0);
}
}  // namespace

CostModel measure_cost_model(Forward& fwd) {
  CostModel m;
  m.layers = static_cast<size_t>(std::max(fwd.model().hparams().n_layers, 1));
  timed_pass(fwd, 1);  // warm-up: first-touch of the weights is not a pass's price
  const double one = timed_pass(fwd, 1);
  const double many = timed_pass(fwd, kMeasureRows);
  m.ms_per_row_layer = std::max(many - one, 1e-6) / (static_cast<double>(kMeasureRows - 1) * static_cast<double>(m.layers));
  m.fixed_ms = std::max(one - static_cast<double>(m.layers) * m.ms_per_row_layer, 0.0);
  return m;
}

CostModel SharedCostModel::get() const {
  std::lock_guard lock(mu_);
  return m_;
}

void SharedCostModel::observe(double rows, double ms) {
  std::lock_guard lock(mu_);
  m_.observe(rows, ms);
}

SharedCostModel& shared_cost_model(Forward& fwd) {
  static std::mutex mu;
  static std::map<uint64_t, std::unique_ptr<SharedCostModel>> models;  // by model fingerprint
  std::lock_guard lock(mu);
  auto& m = models[fwd.model().fingerprint()];
  if (!m) m = std::make_unique<SharedCostModel>(measure_cost_model(fwd));
  return *m;
}

}  // namespace cf::autoq

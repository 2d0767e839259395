#include "serve/piece_sizer.h"

#include <algorithm>
#include <cmath>

namespace cf {

double PrefillPieceSizer::decode_ms(size_t rows) const {
  if (w_ <= 0) return 0;
  const double mean_b = sb_ / w_, mean_m = sm_ / w_;
  const double var = sbb_ / w_ - mean_b * mean_b;
  // Flat until the steps differ in batch (a slope needs two sizes); never decreasing in rows.
  const double slope = var > 0.05 ? std::max(0.0, (sbm_ / w_ - mean_b * mean_m) / var) : 0.0;
  return std::max(0.0, mean_m + slope * (static_cast<double>(rows) - mean_b));
}

// ms = per_row x n + per_entry x s by least squares through the origin; per row alone (its
// least squares) when the pieces do not tell the two apart or a cost comes out negative.
PrefillPieceSizer::Costs PrefillPieceSizer::piece_costs() const {
  if (pnn_ <= 0) return {};
  const double det = pnn_ * pss_ - pns_ * pns_;
  if (det > 1e-6 * pnn_ * pss_) {
    const Costs c{(pnm_ * pss_ - psm_ * pns_) / det, (pnn_ * psm_ - pns_ * pnm_) / det};
    if (c.per_row >= 0 && c.per_entry >= 0) return c;
  }
  return {pnm_ / pnn_, 0};
}

double PrefillPieceSizer::piece_ms(size_t rows, double position_sum) const {
  const Costs c = piece_costs();
  return c.per_row * static_cast<double>(rows) + c.per_entry * position_sum;
}

double PrefillPieceSizer::target_ms(size_t demand) const {
  if (target_ms_ == kAuto) return kAutoFactor * decode_ms(demand);
  return target_ms_ > 0 ? target_ms_ : 0;
}

size_t PrefillPieceSizer::next_rows(std::span<const int32_t> upcoming, size_t decoding, size_t demand,
                                    double waited_ms) const {
  const size_t most = std::max<size_t>(max_rows_, 1);
  if (decoding == 0 || target_ms_ == 0) return most;
  const double target = target_ms(std::max(demand, decoding));
  const Costs c = piece_costs();
  if (target <= 0 || c.per_row + c.per_entry <= 0) return std::min(most, kMinRows);  // measure first
  double budget = target - decode_ms(decoding) - std::max(0.0, waited_ms);
  size_t rows = 0;
  for (; rows < std::min(most, upcoming.size()); ++rows) {
    budget -= c.per_row + c.per_entry * static_cast<double>(std::max<int32_t>(upcoming[rows], 0));
    if (budget < -1e-9) break;  // -1e-9: a budget spent exactly still buys its last row
  }
  return std::min(most, std::max(kMinRows, rows));
}

void PrefillPieceSizer::record_piece(size_t rows, double position_sum, double ms) {
  if (rows == 0 || !(ms >= 0) || !(position_sum >= 0)) return;
  const double n = static_cast<double>(rows), s = position_sum;
  pnn_ = kDecay * pnn_ + n * n;
  pns_ = kDecay * pns_ + n * s;
  pss_ = kDecay * pss_ + s * s;
  pnm_ = kDecay * pnm_ + n * ms;
  psm_ = kDecay * psm_ + s * ms;
}

void PrefillPieceSizer::record_decode(size_t rows, double ms) {
  if (rows == 0 || !(ms >= 0)) return;
  const double b = static_cast<double>(rows);
  w_ = kDecay * w_ + 1;
  sb_ = kDecay * sb_ + b;
  sbb_ = kDecay * sbb_ + b * b;
  sm_ = kDecay * sm_ + ms;
  sbm_ = kDecay * sbm_ + b * ms;
}

}  // namespace cf

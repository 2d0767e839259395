// Progress of long offline work on standard error (precompute, enrichment, benchmarks):
// redrawn in place on a terminal (at most 5 times a second), one line per tenth of the
// work (and at least one a minute) otherwise, so logs stay short. Plus the small
// formatters the reports share.
#pragma once
#include <cstddef>
#include <string>

namespace cf {

std::string format_duration(double seconds);  // "m:ss" or "h:mm:ss"
std::string format_bytes(double bytes);        // "512 B", "7.8 MiB"

class ProgressBar {
 public:
  // `unit` names what is counted ("chunks", "runs"); a disabled bar prints nothing.
  ProgressBar(size_t total, std::string unit, bool enabled = true);
  // `note` follows the counts and times (rates, the item at hand).
  void update(size_t done, const std::string& note = {});

 private:
  size_t total_;
  std::string unit_;
  bool enabled_, tty_;
  double t0_ms_, last_draw_ms_ = -1e18;
  size_t last_tenth_ = static_cast<size_t>(-1);
};

}  // namespace cf

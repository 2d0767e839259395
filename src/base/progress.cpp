#include "base/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "base/clock.h"

namespace cf {

std::string format_duration(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

ProgressBar::ProgressBar(size_t total, std::string unit, bool enabled)
    : total_(total), unit_(std::move(unit)), enabled_(enabled), tty_(::isatty(2)), t0_ms_(now_ms()) {}

void ProgressBar::update(size_t done, const std::string& note) {
  if (!enabled_) return;
  const double now = now_ms();
  const bool last = done == total_;
  if (tty_) {
    if (!last && now - last_draw_ms_ < 200) return;
  } else {
    // A line per tenth of the work, and at least one a minute: a long benchmark's log
    // shows it is alive without growing by a line per item.
    const size_t tenth = total_ ? done * 10 / total_ : 10;
    if (!last && tenth == last_tenth_ && now - last_draw_ms_ < 60000) return;
    last_tenth_ = tenth;
  }
  last_draw_ms_ = now;
  const double secs = (now - t0_ms_) / 1000;
  const double eta = done > 0 ? secs / done * (total_ - done) : 0;
  constexpr int kWidth = 30;
  const int filled = total_ ? static_cast<int>(kWidth * done / total_) : kWidth;
  std::fprintf(stderr, "%s[%s%s] %zu/%zu %s  %s elapsed  ETA %s  %s%s", tty_ ? "\r" : "",
               std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(), done, total_,
               unit_.c_str(), format_duration(secs).c_str(), done > 0 ? format_duration(eta).c_str() : "?",
               note.c_str(), tty_ && !last ? "   " : "\n");
  std::fflush(stderr);
}

}  // namespace cf

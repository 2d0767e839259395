// The one clock of the engine's timings: std::chrono::steady_clock (monotonic, never jumps with
// the wall clock), read in milliseconds as a double. Every TTFT, load, compute and offline time
// the engine reports, and every deadline it keeps, is measured with these helpers.
#pragma once
#include <chrono>
#include <cstdint>

namespace cf {

using SteadyClock = std::chrono::steady_clock;

// Milliseconds since the steady clock's (arbitrary) epoch: meaningful only as a difference of
// two readings, or as a deadline compared against a later reading.
inline double now_ms() {
  return std::chrono::duration<double, std::milli>(SteadyClock::now().time_since_epoch()).count();
}

// now_ms() truncated to whole milliseconds, for deadlines kept in an integer (or an atomic).
inline int64_t now_whole_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now().time_since_epoch()).count();
}

// Milliseconds from a to b (negative when b is earlier).
inline double ms_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Milliseconds from t to now.
inline double ms_since(SteadyClock::time_point t) { return ms_between(t, SteadyClock::now()); }

}  // namespace cf

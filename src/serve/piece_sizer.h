// How many prompt rows the next piece of a split prefill takes (issue 58 item 1, the
// inter-token-latency target; serve --itl-target-ms).
//
// A running answer waits for each prefill piece and then one decode step, so the gap between
// two of its tokens is piece + decode step (+ whatever else ran since its last token). With a
// target gap T, a piece gets T minus the decode step of the batch running now and minus the time
// already gone since the last token, and takes as many of the upcoming rows as that buys at the
// measured costs. T is fixed (--itl-target-ms N) or, by default, kAutoFactor times the decode
// step of the batch the requests in the server would form with no prefill arriving (running +
// waiting + the one prefilling, at most --max-batch): the issue's target, "within 3x of the
// inter-token latency with no prefill arriving", whatever the machine and model. Not 3x the
// batch running now: small pieces finish answers before the next prompt joins them, the batch
// shrinks, its step gets cheaper, and a target tied to it would shrink the pieces further (one
// request decoding alone at a time, measured: 0.7x the throughput). Sarathi-Serve (Agrawal et
// al., OSDI 2024) likewise derives its token budget from a TBT SLO, by profiling ahead; here
// the costs are measured while serving.
//
// Costs, fitted by least squares over recent measurements (each weighing kDecay of the next):
//  - a decode step: fixed + per-row x rows (flat until two batch sizes were seen);
//  - a piece: per-row x rows + per-entry x the sum of its rows' positions, since a row attends
//    to every entry before it: a prompt's later pieces, and a fused prefill's recomputed rows
//    late in the context, cost more per row (flat per row until the pieces differ in position).
//
// Nobody decoding: a piece takes max_rows (serve --prefill-chunk), as before. No piece measured
// yet: kMinRows. Never below kMinRows: a pass reads every weight once whatever its rows, so tiny
// pieces would spend the machine on reading weights.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace cf {

class PrefillPieceSizer {
 public:
  static constexpr double kAuto = -1;  // target = kAutoFactor x the decode step with no prefill
  static constexpr double kAutoFactor = 3;
  static constexpr size_t kMinRows = 16;
  static constexpr double kDecay = 0.9;

  // target_ms: kAuto, 0 (off: every piece takes max_rows) or a gap in milliseconds.
  PrefillPieceSizer(double target_ms, size_t max_rows) : target_ms_(target_ms), max_rows_(max_rows) {}

  // Rows of the next piece, from the positions of the rows still to run: `decoding` requests
  // wait for their next token and have waited `waited_ms` since their last one (a request's
  // lookup and stitching, a piece before); `demand` of them would decode together if no
  // prefill were arriving.
  size_t next_rows(std::span<const int32_t> upcoming, size_t decoding, size_t demand, double waited_ms = 0) const;
  // A piece's rows, the sum of their positions, and its time alone.
  void record_piece(size_t rows, double position_sum, double ms);
  void record_decode(size_t rows, double ms);  // a decode step's batch and its time

  double piece_ms(size_t rows, double position_sum) const;  // 0 until a piece was measured
  double decode_ms(size_t rows) const;                      // 0 until a step was measured
  double target_ms(size_t demand) const;                    // the gap aimed at (0: off or unknown yet)

 private:
  struct Costs {
    double per_row = 0, per_entry = 0;
  };
  Costs piece_costs() const;
  double target_ms_;
  size_t max_rows_;
  // Decayed sums of the pieces (n rows, s = position sum, m ms) and of the decode steps (b, m).
  double pnn_ = 0, pns_ = 0, pss_ = 0, pnm_ = 0, psm_ = 0;
  double w_ = 0, sb_ = 0, sbb_ = 0, sm_ = 0, sbm_ = 0;
};

}  // namespace cf

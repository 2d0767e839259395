// How a prefill piece is sized beside running answers (serve --itl-target-ms, issue 58 item 1):
// the rule of serve/piece_sizer.h on made-up costs, so that each branch is pinned by a number.
#include "serve/piece_sizer.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace cf {
namespace {

using Sizer = PrefillPieceSizer;

std::vector<int32_t> positions(int32_t first, size_t n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), first);
  return p;
}

// A piece of `rows` rows from `first` on at `per_row` ms a row, whatever their positions.
void flat_piece(Sizer& s, size_t rows, double per_row, int32_t first = 0) {
  const auto p = positions(first, rows);
  s.record_piece(rows, std::accumulate(p.begin(), p.end(), 0.0), per_row * static_cast<double>(rows));
}

const std::vector<int32_t> kMany = positions(1000, 1000);

TEST(PrefillPieceSizer, NobodyDecodingOrTargetOffTakesTheWholeChunk) {
  Sizer automatic(Sizer::kAuto, 256), off(0, 256);
  for (Sizer* s : {&automatic, &off}) {
    flat_piece(*s, 10, 3);
    s->record_decode(1, 40);
  }
  EXPECT_EQ(automatic.next_rows(kMany, 0, 1), 256u);
  EXPECT_EQ(off.next_rows(kMany, 4, 8), 256u);
  EXPECT_EQ(off.target_ms(8), 0);
}

TEST(PrefillPieceSizer, MeasuresFirstWithTheSmallestPiece) {
  Sizer s(Sizer::kAuto, 256);
  EXPECT_EQ(s.next_rows(kMany, 1, 1), Sizer::kMinRows);  // nothing measured
  s.record_decode(1, 40);
  EXPECT_EQ(s.next_rows(kMany, 1, 1), Sizer::kMinRows);  // no row cost yet
  Sizer small(Sizer::kAuto, 8);
  EXPECT_EQ(small.next_rows(kMany, 1, 1), 8u);  // never past --prefill-chunk
}

// One batch size seen: the step is taken as flat. Auto aims at 3 steps, so a piece gets 2:
// 2 x 40 ms at 2.5 ms a row (pieces measured at one place: the cost is per row alone).
TEST(PrefillPieceSizer, AutoGivesAPieceTwoDecodeSteps) {
  Sizer s(Sizer::kAuto, 256);
  s.record_decode(2, 40);
  flat_piece(s, 16, 2.5, 500);
  EXPECT_DOUBLE_EQ(s.target_ms(2), 120);
  EXPECT_EQ(s.next_rows(kMany, 2, 2), 32u);
  EXPECT_EQ(s.next_rows(kMany, 0, 2), 256u);
}

// Steps of 1 and 3 rows at 10 and 30 ms: 10 ms a row. With 8 requests in the server and 2
// decoding, the target is 3 x 80 ms and the piece gets 240 - 20 ms: at 2 ms a row, 110 rows.
// Tied to the batch running now it would get 2 x 20 ms, 20 rows: the shrinking spiral.
TEST(PrefillPieceSizer, AutoAimsAtTheBatchTheServerWouldFormWithoutPrefill) {
  Sizer s(Sizer::kAuto, 512);
  for (int i = 0; i < 4; ++i) {
    s.record_decode(1, 10);
    s.record_decode(3, 30);
  }
  EXPECT_NEAR(s.decode_ms(8), 80, 1e-9);
  EXPECT_NEAR(s.decode_ms(2), 20, 1e-9);
  flat_piece(s, 50, 2);
  EXPECT_NEAR(s.target_ms(8), 240, 1e-9);
  EXPECT_EQ(s.next_rows(kMany, 2, 8), 110u);
  EXPECT_EQ(s.next_rows(kMany, 2, 2), 20u);
  EXPECT_EQ(s.next_rows(kMany, 2, 1), 20u);  // the demand counts the decoding ones at least
}

TEST(PrefillPieceSizer, AFixedTargetLeavesRoomForTheDecodeStep) {
  Sizer s(200, 256);
  s.record_decode(4, 50);
  flat_piece(s, 20, 1.5);  // (200 - 50) / 1.5 = 100 rows
  EXPECT_EQ(s.next_rows(kMany, 4, 8), 100u);
  // 60 ms already gone since the streams' last token (a request's stitching): 90 ms left, 60 rows.
  EXPECT_EQ(s.next_rows(kMany, 4, 8, 60), 60u);
  EXPECT_EQ(s.next_rows(kMany, 4, 8, 500), Sizer::kMinRows);
  EXPECT_EQ(s.next_rows(positions(0, 30), 4, 8), 30u);  // all that is left fits
  Sizer capped(200, 64);
  capped.record_decode(4, 50);
  flat_piece(capped, 20, 1.5);
  EXPECT_EQ(capped.next_rows(kMany, 4, 8), 64u);  // capped by --prefill-chunk
  Sizer tight(40, 256);
  tight.record_decode(4, 50);  // the decode step alone exceeds the target
  flat_piece(tight, 20, 1.5);
  EXPECT_EQ(tight.next_rows(kMany, 4, 4), Sizer::kMinRows);
}

// A row costs 0.5 ms + 0.001 ms per entry before it (its attention). Pieces at positions 0..99
// and 1000..1099 tell the two apart; a budget of 100 ms then buys 65 rows at 1000.. (1.5 ms and
// more a row) but 170 at 0.. (0.5 ms and more): rows late in a prompt cost more.
TEST(PrefillPieceSizer, RowsLaterInThePromptCostMore) {
  Sizer s(100, 512);
  s.record_decode(1, 0);
  for (int32_t first : {0, 1000, 0, 1000}) {
    const auto p = positions(first, 100);
    double ms = 0, sum = 0;
    for (int32_t x : p) {
      ms += 0.5 + 0.001 * x;
      sum += x;
    }
    s.record_piece(p.size(), sum, ms);
  }
  const auto late = positions(1000, 500), early = positions(0, 500);
  EXPECT_NEAR(s.piece_ms(1, 1000), 1.5, 1e-9);
  EXPECT_EQ(s.next_rows(late, 1, 1), 65u);
  EXPECT_EQ(s.next_rows(early, 1, 1), 170u);
}

// The costs follow the newest measurements (each weighs 1 / kDecay of the one before).
TEST(PrefillPieceSizer, EstimatesFollowTheLatestMeasurements) {
  Sizer s(Sizer::kAuto, 512);
  s.record_decode(1, 30);
  flat_piece(s, 60, 1, 300);
  EXPECT_EQ(s.next_rows(kMany, 1, 1), 60u);
  for (int i = 0; i < 60; ++i) flat_piece(s, 20, 3, 300);  // the old 1 ms weighs 0.9^60
  EXPECT_NEAR(s.piece_ms(1, 300), 3, 0.01);
  EXPECT_EQ(s.next_rows(kMany, 1, 1), 20u);
  for (int i = 0; i < 60; ++i) s.record_decode(1, 50);
  EXPECT_NEAR(s.decode_ms(1), 50, 0.01);
  s.record_piece(0, 0, 10);  // an empty piece or batch says nothing
  s.record_decode(0, 10);
  EXPECT_NEAR(s.piece_ms(1, 300), 3, 0.01);
  EXPECT_NEAR(s.decode_ms(1), 50, 0.01);
}

}  // namespace
}  // namespace cf

// KeyQuota (serve/key_quota.h): the per-key bound on POST /v1/chunks texts in flight.
#include "serve/key_quota.h"

#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>

#include "serve/request.h"

namespace cf {
namespace {

int status_of_refusal(KeyQuota& q, int key, size_t texts) {
  try {
    (void)q.acquire(key, texts);
  } catch (const RequestError& e) {
    EXPECT_EQ(e.code, "key_busy");
    EXPECT_NE(std::string(e.what()).find("--max-key-chunk-texts"), std::string::npos) << e.what();
    return e.status;
  }
  return 0;
}

TEST(KeyQuota, AKeyPastItsBoundIsRefusedAndOtherKeysAreNot) {
  KeyQuota q(4);
  std::optional<KeyQuota::Hold> a = q.acquire(0, 3);
  EXPECT_EQ(q.in_flight(0), 3u);
  EXPECT_EQ(status_of_refusal(q, 0, 2), 429);  // 3 + 2 > 4
  EXPECT_EQ(q.refused(), 1u);
  EXPECT_EQ(q.in_flight(0), 3u);  // a refusal takes nothing
  {
    const KeyQuota::Hold one_more = q.acquire(0, 1);  // exactly at the bound
    EXPECT_EQ(q.in_flight(0), 4u);
    const KeyQuota::Hold other_key = q.acquire(1, 4);  // another key has its own bound
    const KeyQuota::Hold anonymous = q.acquire(-1, 4);  // and so has a server without keys
    EXPECT_EQ(q.in_flight(), 12u);
  }
  EXPECT_EQ(q.in_flight(0), 3u);
  EXPECT_EQ(q.in_flight(1), 0u);
  a.reset();  // the first registration ends: the key's whole bound is free again
  EXPECT_EQ(q.in_flight(), 0u);
  const KeyQuota::Hold all = q.acquire(0, 4);
  EXPECT_EQ(status_of_refusal(q, 0, 1), 429);
  EXPECT_EQ(q.refused(), 2u);
}

TEST(KeyQuota, AMovedHoldReleasesOnce) {
  KeyQuota q(2);
  {
    KeyQuota::Hold first = q.acquire(7, 2);
    KeyQuota::Hold moved(std::move(first));
    EXPECT_EQ(q.in_flight(7), 2u);
  }
  EXPECT_EQ(q.in_flight(7), 0u);
  const KeyQuota::Hold again = q.acquire(7, 2);
  EXPECT_EQ(q.in_flight(7), 2u);
}

TEST(KeyQuota, ABoundOfZeroIsRefused) { EXPECT_THROW(KeyQuota(0), std::invalid_argument); }

}  // namespace
}  // namespace cf

// The serving loop on the real model (issue 58): a long prefill runs in pieces with the
// running requests decoding between them (chunked prefill), and a cancelled job stops where
// it is: unprefilled in the queue, at its next piece in a prefill, at its next decode step.
#include "serve/scheduler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "../runtime/model_fixture.h"
#include "runtime/forward.h"
#include "serve/kv_budget.h"

namespace cf {
namespace {

using test::shared_model;
using test::shared_pool;

std::vector<TokenId> prompt_tokens(size_t n) {
  std::string text;
  std::vector<TokenId> ids;
  while (ids.size() < n) {
    text += "Count with me from one to one hundred: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, ";
    ids = shared_model().tokenizer().encode(text, true, false);
  }
  ids.resize(n);
  return ids;
}

// A job whose prefill is a plain prefill of `tokens` (what the engine's full method does).
void plain_job(SchedulerJob& job, std::vector<TokenId> tokens, int max_tokens) {
  job.history = tokens;
  job.generate.max_tokens = max_tokens;
  job.generate.sampling.temperature = 0;
  job.prefill = [tokens](Forward& fw) {
    PrefillOutput out{{}, KvCache(fw.model().hparams(), tokens.size() + 64), static_cast<int32_t>(tokens.size())};
    std::vector<int32_t> pos(tokens.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    const size_t last = tokens.size() - 1;
    out.logits = fw.run(out.cache, {tokens, pos, {}, std::span(&last, 1)}).logits;
    return out;
  };
}

// While request A decodes, request B (100 prompt rows) prefills in pieces of 16 with one decode
// step of A after each piece but the last; with prefill_chunk 0 it prefills whole, A waits.
// B's first-token logits are the same bits either way.
void run_beside_a_decode(SchedulerOptions opt, size_t b_rows, uint64_t& steps_during_b, std::vector<float>& b_logits,
                         size_t* last_piece = nullptr) {
  Forward fwd(shared_model(), shared_pool());
  Scheduler sched(fwd, opt);
  SchedulerJob a, b;
  plain_job(a, prompt_tokens(12), 64);
  std::promise<void> a_running;
  bool signalled = false;
  a.generate.on_text = [&](std::string_view) {
    if (!signalled) a_running.set_value();
    signalled = true;
    return true;
  };
  plain_job(b, prompt_tokens(b_rows), 1);
  auto b_prefill = b.prefill;
  b.prefill = [&](Forward& fw) {
    const uint64_t before = sched.decode_steps();
    PrefillOutput out = b_prefill(fw);
    steps_during_b = sched.decode_steps() - before;
    b_logits = out.logits;
    return out;
  };
  b.generate.on_text = [&](std::string_view) { return true; };
  sched.submit(a);
  a_running.get_future().wait();
  sched.submit(b);
  sched.wait(b);
  if (last_piece) *last_piece = sched.last_piece_rows();
  sched.wait(a);
  EXPECT_GE(a.session->tokens().size(), 10u) << "A must still decode while B prefills";
}

TEST(Scheduler, ChunkedPrefillDecodesTheRunningRequestsBetweenPieces) {
  CF_REQUIRE_MODEL();
  uint64_t chunked_steps = 0, whole_steps = 0;
  std::vector<float> chunked_logits, whole_logits;
  SchedulerOptions fixed{8, 8, 16};
  fixed.itl_target_ms = 0;  // pieces of prefill_chunk rows, whatever they cost
  run_beside_a_decode(fixed, 100, chunked_steps, chunked_logits);
  fixed.prefill_chunk = 0;
  run_beside_a_decode(fixed, 100, whole_steps, whole_logits);
  EXPECT_EQ(chunked_steps, 6u);  // 100 rows in pieces of 16: 7 pieces, 6 pauses
  EXPECT_EQ(whole_steps, 0u);
  ASSERT_EQ(chunked_logits.size(), whole_logits.size());
  EXPECT_EQ(0, std::memcmp(chunked_logits.data(), whole_logits.data(), chunked_logits.size() * sizeof(float)));
}

// The inter-token-latency target (serve --itl-target-ms, on auto by default): beside a running
// answer, B's 300 rows go in pieces sized by their measured cost, far below the 256 rows that
// fixed pieces would take (one pause), the first of kMinRows to measure; the bits are still
// those of one pass.
TEST(Scheduler, PiecesBesideARunningAnswerAreSizedByTheLatencyTarget) {
  CF_REQUIRE_MODEL();
  uint64_t sized_steps = 0, fixed_steps = 0;
  std::vector<float> sized_logits, fixed_logits;
  SchedulerOptions sized{8, 8, 256};
  size_t last_piece = 0;
  run_beside_a_decode(sized, 300, sized_steps, sized_logits, &last_piece);
  SchedulerOptions fixed = sized;
  fixed.itl_target_ms = 0;
  run_beside_a_decode(fixed, 300, fixed_steps, fixed_logits);
  EXPECT_EQ(fixed_steps, 1u);  // 300 rows: 256 + 44
  // Auto aims at 3 decode steps of a one-row batch, so a piece gets the time of 2: a decode step
  // reads every weight once, as a pass does, which buys tens of prefill rows, not 256.
  EXPECT_GE(sized_steps, 4u);
  EXPECT_LT(last_piece, 256u);
  EXPECT_GE(last_piece, PrefillPieceSizer::kMinRows);
  ASSERT_EQ(sized_logits.size(), fixed_logits.size());
  EXPECT_EQ(0, std::memcmp(sized_logits.data(), fixed_logits.data(), sized_logits.size() * sizeof(float)));
}

void expect_client_gone(Scheduler& sched, SchedulerJob& job) {
  try {
    sched.wait(job);
    ADD_FAILURE() << "a cancelled job finished";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 499);
  }
}

TEST(Scheduler, CancelledJobsStopWhereTheyAre) {
  CF_REQUIRE_MODEL();
  Forward fwd(shared_model(), shared_pool());
  Scheduler sched(fwd, SchedulerOptions{8, 8, 16});

  // Waiting: the scheduler thread is held by a prefill that waits for a latch; the job behind
  // it is cancelled, then the latch opens: its prefill never runs.
  SchedulerJob holder, queued;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  plain_job(holder, prompt_tokens(8), 1);
  auto holder_prefill = holder.prefill;
  holder.prefill = [&, released](Forward& fw) {
    released.wait();
    return holder_prefill(fw);
  };
  bool queued_prefilled = false;
  plain_job(queued, prompt_tokens(8), 4);
  queued.prefill = [&](Forward&) -> PrefillOutput {
    queued_prefilled = true;
    throw std::logic_error("never");
  };
  sched.submit(holder);
  sched.submit(queued);
  queued.cancel = true;
  release.set_value();
  sched.wait(holder);
  expect_client_gone(sched, queued);
  EXPECT_FALSE(queued_prefilled);

  // Prefilling: the client leaves as the prefill starts; it stops after its first piece.
  SchedulerJob prefilling;
  plain_job(prefilling, prompt_tokens(100), 4);
  auto prefill = prefilling.prefill;
  prefilling.prefill = [&](Forward& fw) {
    prefilling.cancel = true;
    return prefill(fw);
  };
  const uint64_t pieces_before = sched.prefill_pieces();
  sched.submit(prefilling);
  expect_client_gone(sched, prefilling);
  EXPECT_EQ(sched.prefill_pieces() - pieces_before, 1u);

  // Running: cancelled after its third token, it leaves at the next decode step.
  SchedulerJob running;
  plain_job(running, prompt_tokens(12), 40);
  size_t pieces = 0, tokens_at_cancel = 0;
  running.generate.on_text = [&](std::string_view) {
    if (++pieces == 3) {
      running.cancel = true;
      tokens_at_cancel = running.session->tokens().size();
    }
    return true;
  };
  sched.submit(running);
  expect_client_gone(sched, running);
  ASSERT_GT(tokens_at_cancel, 0u);
  EXPECT_LE(running.session->tokens().size(), tokens_at_cancel + 1);
  EXPECT_EQ(sched.running(), 0u);

  // The waiter's probe cancels: asked while the job runs, it says the client left.
  SchedulerJob probed;
  plain_job(probed, prompt_tokens(12), 400);
  sched.submit(probed);
  int asked = 0;
  try {
    sched.wait(probed, [&] { return ++asked >= 2; });
    ADD_FAILURE() << "the probed job finished";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 499);
  }
  EXPECT_GE(asked, 2);
  EXPECT_LT(probed.session->tokens().size(), 400u);
  EXPECT_EQ(sched.cancelled_jobs(), 4u);
}

// The order of prefills: three jobs queue behind one that holds the scheduler thread, each
// with its own priority and work; FIFO, priority and shortest-first take them in their orders,
// and under shortest-first a job that has waited past max_wait_ms goes first.
std::vector<int> prefill_order(SchedulerOrder order, size_t max_wait_ms, int aged_first_ms) {
  Forward fwd(shared_model(), shared_pool());
  SchedulerOptions so{8, 8, 16};
  so.order = order;
  so.max_wait_ms = max_wait_ms;
  Scheduler sched(fwd, so);
  std::mutex mu;
  std::vector<int> order_seen;
  SchedulerJob holder, jobs[3];
  std::promise<void> held, release;
  std::shared_future<void> released = release.get_future().share();
  plain_job(holder, prompt_tokens(4), 1);
  auto holder_prefill = holder.prefill;
  holder.prefill = [&, released](Forward& fw) {
    held.set_value();
    released.wait();
    return holder_prefill(fw);
  };
  const int priority[3] = {1, 3, 2};
  const size_t work[3] = {100, 10, 50};
  sched.submit(holder);
  held.get_future().wait();
  for (int i = 0; i < 3; ++i) {
    plain_job(jobs[i], prompt_tokens(4), 1);
    jobs[i].priority = priority[i];
    jobs[i].work = work[i];
    auto inner = jobs[i].prefill;
    jobs[i].prefill = [&, i, inner](Forward& fw) {
      std::lock_guard lock(mu);
      order_seen.push_back(i);
      return inner(fw);
    };
    sched.submit(jobs[i]);
    if (i == 0 && aged_first_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(aged_first_ms));
  }
  release.set_value();
  sched.wait(holder);
  for (auto& j : jobs) sched.wait(j);
  return order_seen;
}

TEST(Scheduler, OrdersByArrivalPriorityOrWorkAndNoJobStarves) {
  CF_REQUIRE_MODEL();
  EXPECT_EQ(prefill_order(SchedulerOrder::fifo, 30000, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(prefill_order(SchedulerOrder::priority, 30000, 0), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(prefill_order(SchedulerOrder::shortest, 30000, 0), (std::vector<int>{1, 2, 0}));
  // Job 0 (the most work) waited 300 ms, past the bound of 150: it goes first, the rest by work.
  EXPECT_EQ(prefill_order(SchedulerOrder::shortest, 150, 300), (std::vector<int>{0, 1, 2}));
  SchedulerOrder o;
  EXPECT_TRUE(parse_scheduler_order("shortest", o));
  EXPECT_EQ(o, SchedulerOrder::shortest);
  EXPECT_FALSE(parse_scheduler_order("lifo", o));
}

// K/V in bytes: two jobs whose reservations do not fit together run one after the other, the
// second keeping its place in the queue (never failing); one larger than the budget is 413.
TEST(Scheduler, AJobWaitsForRoomInTheKvBudget) {
  CF_REQUIRE_MODEL();
  Forward fwd(shared_model(), shared_pool());
  SchedulerOptions so{8, 8, 16};
  so.kv_budget_bytes = 1000;
  Scheduler sched(fwd, so);
  SchedulerJob first, second, small, huge;
  plain_job(first, prompt_tokens(12), 12);
  plain_job(second, prompt_tokens(12), 4);
  plain_job(small, prompt_tokens(12), 4);
  first.kv_bytes = 600;
  second.kv_bytes = 600;
  small.kv_bytes = 300;  // fits beside the first: joins it, but after the second (FIFO)
  size_t reserved_seen = 0;
  first.generate.on_text = [&](std::string_view) {
    reserved_seen = std::max(reserved_seen, sched.kv_reserved_bytes());
    return true;
  };
  sched.submit(first);
  sched.submit(second);
  sched.submit(small);
  sched.wait(first);
  sched.wait(second);
  sched.wait(small);
  EXPECT_GE(second.started, first.finished);  // waited for room, did not fail
  EXPECT_GE(small.started, second.started);   // kept behind the second
  EXPECT_LE(reserved_seen, 1000u);
  EXPECT_EQ(sched.kv_reserved_bytes(), 0u);
  huge.kv_bytes = 1001;
  plain_job(huge, prompt_tokens(4), 1);
  try {
    sched.submit(huge);
    ADD_FAILURE() << "a job over the whole budget was queued";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 413);
    EXPECT_EQ(e.param, "max_tokens");
  }
}

// One budget with the caches (serve/kv_budget.h): a cache holds most of it; a job that fits only
// once the cache gives back is admitted (not left waiting), the cache holding less after; while
// it runs, the cache cannot take its reserved room back.
TEST(Scheduler, AJobIsAdmittedOnceTheCachesGiveBackItsRoom) {
  CF_REQUIRE_MODEL();
  KvBudget budget(1000);
  size_t cache_held = 0;
  KvAccount* account = nullptr;
  account = &budget.add_cache("fake", [&](size_t n) {
    const size_t freed = std::min(n, cache_held);
    cache_held -= freed;
    account->discharge(freed);
    return freed;
  });
  ASSERT_TRUE(account->try_charge(800));
  cache_held = 800;
  Forward fwd(shared_model(), shared_pool());
  SchedulerOptions so{8, 8, 16};
  so.kv_budget = &budget;
  Scheduler sched(fwd, so);
  EXPECT_EQ(sched.kv_budget_bytes(), 1000u);
  SchedulerJob job;
  plain_job(job, prompt_tokens(12), 8);
  job.kv_bytes = 600;
  bool charged_while_running = false;
  size_t reserved_while_running = 0;
  job.generate.on_text = [&](std::string_view) {
    if (account->try_charge(1)) {  // the room left is the running job's: a cache gets none of it
      charged_while_running = true;
      account->discharge(1);
    }
    reserved_while_running = sched.kv_reserved_bytes();
    return true;
  };
  sched.submit(job);
  auto waited = std::async(std::launch::async, [&] { sched.wait(job); });
  if (waited.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    job.cancel = true;  // still queued: let it go, so that the test ends
    ADD_FAILURE() << "the job was never admitted";
  }
  try {
    waited.get();
  } catch (const RequestError& e) {
    ADD_FAILURE() << "the job failed with " << e.status;
  }
  EXPECT_EQ(reserved_while_running, 600u);
  EXPECT_FALSE(charged_while_running);  // the 400 left free were the cache's at most
  EXPECT_LE(cache_held, 400u);
  EXPECT_EQ(budget.admission_evicted_bytes(), 800u - cache_held);
  EXPECT_EQ(sched.kv_reserved_bytes(), 0u);
}

}  // namespace
}  // namespace cf

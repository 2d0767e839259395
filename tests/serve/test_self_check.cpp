// The server checks itself while serving (issue 60 item 3): the ledger's numbers and rules on
// fixed inputs, then on the real model the idle worker's checks (a right and a wrong answer, the
// bounded queue, the recalibration), their place behind arriving requests (order of events,
// not times), and the engine's sampling of its served fused answers.
#include "serve/self_check.h"
#include "serve/self_check_ledger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include "../runtime/model_fixture.h"
#include "fusion/methods.h"
#include "serve/engine.h"

namespace cf {
namespace {

using test::shared_model;
using test::shared_pool;

// ---- the ledger, pure ----

TEST(SelfCheckLedger, WilsonIntervalMatchesKnownValues) {
  const ShareInterval a = wilson_interval(18, 24);
  EXPECT_NEAR(a.low, 0.551, 5e-4);
  EXPECT_NEAR(a.high, 0.880, 5e-4);
  const ShareInterval all = wilson_interval(10, 10);  // n / (n + z^2)
  EXPECT_NEAR(all.low, 10 / (10 + 1.96 * 1.96), 1e-9);
  EXPECT_DOUBLE_EQ(all.high, 1.0);
  const ShareInterval none = wilson_interval(0, 10);
  EXPECT_DOUBLE_EQ(none.low, 0.0);
  EXPECT_NEAR(none.high, 1.96 * 1.96 / (10 + 1.96 * 1.96), 1e-9);
  const ShareInterval empty = wilson_interval(0, 0);
  EXPECT_EQ(empty.low, 0.0);
  EXPECT_EQ(empty.high, 1.0);
}

TEST(SelfCheckLedger, MinChecksIsWherePerfectRecordsReachTheTarget) {
  EXPECT_EQ(min_checks(0.9), 35u);  // ceil(3.8416 * 9) = ceil(34.57)
  EXPECT_EQ(min_checks(0.95), 73u);
  EXPECT_EQ(min_checks(0.99), 381u);
  EXPECT_EQ(min_checks(0.5), 20u);  // the floor
  for (double q : {0.8, 0.9, 0.95, 0.99}) {  // a perfect record reaches q at min_checks(q), not sooner (above the floor)
    const uint64_t n = min_checks(q);
    EXPECT_GE(wilson_interval(n, n).low, q) << q;
    if (n > 20) {
      EXPECT_LT(wilson_interval(n - 1, n - 1).low, q) << q;
    }
  }
}

TEST(SelfCheckLedger, RecalibratesBelowTheTargetNotAboveNotBeforeMinChecks) {
  SelfCheckLedger ledger;
  const CheckOutcome same{true, true}, differs{true, false};
  // Below the target from the start (5 misses in the first 5), but not before 35 checks.
  for (int i = 0; i < 34; ++i) EXPECT_FALSE(ledger.record("auto@0.9:reuse@0", 0.9, i < 5 ? differs : same)) << i;
  EXPECT_TRUE(ledger.record("auto@0.9:reuse@0", 0.9, same));  // the 35th: 30/35, lower bound 0.70
  EXPECT_FALSE(ledger.record("auto@0.9:reuse@0", 0.9, differs)) << "fires once";
  // Above it: 198 identical then 2 misses, lower bound 0.964 at 200.
  for (int i = 0; i < 200; ++i) EXPECT_FALSE(ledger.record("auto@0.9:epic@0.15", 0.9, i < 198 ? same : differs)) << i;
  // No target (a fixed method): never.
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(ledger.record("reuse@0", 0, differs));
  const std::vector<PlanRecord> r = ledger.records();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].plan, "auto@0.9:epic@0.15");
  EXPECT_FALSE(r[0].recalibrated);
  EXPECT_EQ(r[0].checked, 200u);
  EXPECT_EQ(r[0].identical, 198u);
  EXPECT_GT(r[0].identical_interval().low, 0.9);
  EXPECT_TRUE(r[1].recalibrated);
  EXPECT_EQ(r[1].checked, 36u);
  EXPECT_EQ(r[1].identical, 30u);
  EXPECT_FALSE(r[2].recalibrated);
  // q = 1 asks for every answer: the first miss after 20 checks.
  SelfCheckLedger strict;
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(strict.record("auto@1:epic@0.3", 1.0, same));
  EXPECT_TRUE(strict.record("auto@1:epic@0.3", 1.0, differs));
}

TEST(SelfCheckLedger, CompareAnswersTokenByTokenAndTheirEnds) {
  const std::vector<TokenId> a = {5, 6, 7};
  EXPECT_TRUE(compare_answers(5, 5, a, false, a, false).identical);
  EXPECT_TRUE(compare_answers(5, 5, a, true, a, true).identical);
  const CheckOutcome late = compare_answers(5, 5, a, false, std::vector<TokenId>{5, 6, 8}, false);
  EXPECT_TRUE(late.first_token_agree);
  EXPECT_FALSE(late.identical);
  // The fused answer ended; full prefill's went on (one more token) or ended sooner.
  EXPECT_FALSE(compare_answers(5, 5, a, true, std::vector<TokenId>{5, 6, 7, 9}, false).identical);
  EXPECT_FALSE(compare_answers(5, 5, a, true, std::vector<TokenId>{5, 6}, true).identical);
  EXPECT_FALSE(compare_answers(5, 4, a, false, a, false).first_token_agree);
}

TEST(SelfCheckLedger, SamplingIsDeterministicByShare) {
  SelfCheckSampler fifth(0.2), none(0), all(1);
  std::vector<int> picked;
  for (int i = 1; i <= 20; ++i) {
    if (fifth.next()) picked.push_back(i);
    EXPECT_FALSE(none.next());
    EXPECT_TRUE(all.next());
  }
  EXPECT_EQ(picked, (std::vector<int>{5, 10, 15, 20}));
  EXPECT_THROW(SelfCheckSampler(1.5), std::invalid_argument);
  EXPECT_THROW(SelfCheckSampler(-0.1), std::invalid_argument);
}

autoq::AutoCalibration two_policy_calibration() {
  autoq::AutoCalibration c;
  c.fingerprint = "test";
  c.steps = {{"reuse", 0.0, nlohmann::json::object(), {0, 0, 0}},
             {"epic", 0.15, nlohmann::json::object(), {0, 0, 0}},
             {"epic", 0.3, nlohmann::json::object(), {0, 0, 0}}};
  autoq::AutoPolicy low, high;
  low.quality = 0.8;
  low.steps = {0, 1};
  high.quality = 0.95;
  high.steps = {1, 2};
  for (size_t bound : {size_t{0}, size_t{1000}}) c.size_classes.push_back({bound, 10, {low, high}});
  return c;
}

TEST(SelfCheckLedger, WithoutStepTakesTheStepOutOfThePolicyServingTheTarget) {
  const autoq::AutoCalibration c = two_policy_calibration();
  const autoq::AutoCalibration d = without_step(c, 0.9, 1);
  for (size_t tokens : {size_t{10}, size_t{2000}}) {
    EXPECT_EQ(d.policy_for(0.9, tokens).steps, (std::vector<size_t>{2})) << tokens;
    EXPECT_EQ(d.policy_for(0.8, tokens).steps, (std::vector<size_t>{0, 1})) << tokens;
  }
  EXPECT_EQ(c.policy_for(0.9, 10).steps, (std::vector<size_t>{1, 2})) << "the original is left as it was";
}

TEST(SelfCheckLedger, JsonAndPrometheusNameEachPlan) {
  SelfCheckLedger ledger;
  for (int i = 0; i < 24; ++i) ledger.record("epic@0.15", 0, {i < 20, i < 18});
  SelfCheckSnapshot s{{0.2, 30, 6, 24, 1}, ledger.records()};
  const nlohmann::json j = self_check_json(s);
  EXPECT_EQ(j["dropped"], 6);
  ASSERT_EQ(j["plans"].size(), 1u);
  EXPECT_EQ(j["plans"][0]["plan"], "epic@0.15");
  EXPECT_EQ(j["plans"][0]["checked"], 24);
  EXPECT_EQ(j["plans"][0]["identical"], 18);
  EXPECT_EQ(j["plans"][0]["first_token_agree"], 20);
  EXPECT_NEAR(j["plans"][0]["identical_interval"][0].get<double>(), 0.551, 5e-4);
  EXPECT_FALSE(j["plans"][0].contains("quality")) << "a fixed method is held to no target";
  const std::string text = self_check_prometheus(s);
  EXPECT_NE(text.find("chunkfuse_self_check_checked_total{plan=\"epic@0.15\"} 24\n"), std::string::npos) << text;
  EXPECT_NE(text.find("chunkfuse_self_check_identical_total{plan=\"epic@0.15\"} 18\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_self_check_identical_lower{plan=\"epic@0.15\"} 0.55"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_self_check_dropped_total 6\n"), std::string::npos);
}

// ---- the idle worker on the real model ----

std::vector<TokenId> prompt_tokens(size_t n) {
  std::string text;
  std::vector<TokenId> ids;
  while (ids.size() < n) {
    text += "The river runs past the old mill, and the miller counts the sacks: one, two, three, four. ";
    ids = shared_model().tokenizer().encode(text, true, false);
  }
  ids.resize(n);
  return ids;
}

// Full prefill's greedy answer of `prompt`, on a Forward of its own: the first token, then `n`.
std::vector<TokenId> reference_answer(const std::vector<TokenId>& prompt, int n, TokenId& first) {
  Forward fwd(shared_model(), shared_pool());
  KvCache cache(shared_model().hparams(), prompt.size() + n + 1);
  const size_t last = prompt.size() - 1;
  const std::vector<int32_t> pos = test::iota_positions(prompt.size());
  std::vector<float> logits = fwd.run(cache, {prompt, pos, {}, std::span(&last, 1)}).logits;
  first = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  GenerateOptions g;
  g.max_tokens = n;
  g.sampling.temperature = 0;
  return Generator(fwd).continue_from(cache, std::move(logits), static_cast<int32_t>(prompt.size()), prompt, g).tokens;
}

SelfCheckCase make_case(std::string plan, const std::vector<TokenId>& prompt, TokenId first,
                        std::vector<TokenId> answer) {
  SelfCheckCase c;
  c.plan = std::move(plan);
  c.prompt = prompt;
  c.fused_first = first;
  c.fused_answer = std::move(answer);
  c.sampling.temperature = 0;
  return c;
}

// Waits (no time is asserted: the bound only stops a hung test) until `done` says yes.
template <class F>
bool eventually(F done) {
  for (int i = 0; i < 6000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

// The worker and its scheduler; members go scheduler first (its thread runs the worker's steps).
struct Worker {
  Forward fwd{shared_model(), shared_pool()};
  std::unique_ptr<SelfCheck> check;
  Scheduler sched{fwd, SchedulerOptions{}};
  explicit Worker(SelfCheckOptions o, const autoq::AutoCalibration* cal = nullptr) {
    check = std::make_unique<SelfCheck>(sched, shared_model().tokenizer(), std::move(o), cal);
  }
  SelfCheckSnapshot snapshot() const { return check->snapshot(); }
  bool completed(uint64_t n) const {
    return eventually([&] { return check->snapshot().counters.completed >= n; });
  }
};

const PlanRecord* find_plan(const SelfCheckSnapshot& s, const std::string& name) {
  for (const PlanRecord& r : s.plans)
    if (r.plan == name) return &r;
  return nullptr;
}

// Full prefill's own answer agrees with itself, first token and answer; the same answer with
// its last token changed agrees on the first token only. The reference prefill runs in pieces
// of 16 rows (3 idle steps for 40 prompt tokens), which must give one pass's bits.
TEST(SelfCheck, FullPrefillsAnswerAgreesAndAChangedOneDoesNot) {
  CF_REQUIRE_MODEL();
  const std::vector<TokenId> prompt = prompt_tokens(40);
  TokenId first = -1;
  const std::vector<TokenId> answer = reference_answer(prompt, 8, first);
  ASSERT_EQ(answer.size(), 8u);
  std::vector<TokenId> changed = answer;
  changed.back() = changed.back() == 100 ? 101 : 100;

  SelfCheckOptions o;
  o.share = 1;
  o.piece_rows = 16;
  Worker w(o);
  w.check->submit(make_case("right", prompt, first, answer));
  w.check->submit(make_case("wrong", prompt, first, changed));
  ASSERT_TRUE(w.completed(2));
  const SelfCheckSnapshot s = w.snapshot();
  const PlanRecord* right = find_plan(s, "right");
  const PlanRecord* wrong = find_plan(s, "wrong");
  ASSERT_TRUE(right && wrong);
  EXPECT_EQ(right->checked, 1u);
  EXPECT_EQ(right->first_token_agree, 1u);
  EXPECT_EQ(right->identical, 1u);
  EXPECT_EQ(wrong->checked, 1u);
  EXPECT_EQ(wrong->first_token_agree, 1u);
  EXPECT_EQ(wrong->identical, 0u);
  EXPECT_EQ(s.counters.pending, 0u);
}

// A request that arrives while a check is in progress is served before the check's next step:
// the worker's step 1 submits it (on the scheduler thread, so the order is fixed), and the
// request prefills and finishes before step 2 starts. Events, not times.
TEST(SelfCheck, AnArrivingRequestWaitsForOneCheckStepAtMost) {
  CF_REQUIRE_MODEL();
  const std::vector<TokenId> prompt = prompt_tokens(64);
  TokenId first = -1;
  const std::vector<TokenId> answer = reference_answer(prompt, 4, first);
  std::mutex mu;
  std::vector<std::string> events;
  auto log = [&](std::string e) {
    std::lock_guard lock(mu);
    events.push_back(std::move(e));
  };
  SchedulerJob job;
  const std::vector<TokenId> request = prompt_tokens(12);
  job.history = request;
  job.generate.max_tokens = 3;
  job.generate.sampling.temperature = 0;
  job.prefill = [&](Forward& fw) {
    log("request prefill");
    PrefillOutput out{{}, KvCache(fw.model().hparams(), request.size() + 8), static_cast<int32_t>(request.size())};
    const size_t last = request.size() - 1;
    const std::vector<int32_t> pos = test::iota_positions(request.size());
    out.logits = fw.run(out.cache, {request, pos, {}, std::span(&last, 1)}).logits;
    return out;
  };
  job.on_finish = [&](SchedulerJob&) { log("request done"); };

  SelfCheckOptions o;
  o.share = 1;
  o.piece_rows = 16;  // 4 prefill steps, then the decode steps
  Scheduler* sched = nullptr;
  o.on_step = [&](size_t step) {
    log("check step " + std::to_string(step));
    if (step == 1) sched->submit(job);
  };
  Worker w(o);
  sched = &w.sched;
  w.check->submit(make_case("ordered", prompt, first, answer));
  ASSERT_TRUE(w.completed(1));
  w.sched.wait(job);
  std::lock_guard lock(mu);
  const std::vector<std::string> expected_start = {"check step 0", "check step 1", "request prefill", "request done",
                                                   "check step 2"};
  ASSERT_GE(events.size(), expected_start.size());
  EXPECT_EQ(std::vector<std::string>(events.begin(), events.begin() + 5), expected_start);
  const SelfCheckSnapshot after = w.snapshot();
  ASSERT_TRUE(find_plan(after, "ordered"));
  EXPECT_EQ(find_plan(after, "ordered")->identical, 1u) << "the check went on after the request";
}

// The queue keeps the newest `max_pending` cases: while the worker is held in its first step,
// five more arrive for a queue of two; three are dropped (the oldest) and counted.
TEST(SelfCheck, TheQueueIsBoundedAndDropsTheOldest) {
  CF_REQUIRE_MODEL();
  const std::vector<TokenId> prompt = prompt_tokens(10);
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  bool held = false;
  SelfCheckOptions o;
  o.share = 1;
  o.max_pending = 2;
  o.on_step = [&](size_t) {
    if (held) return;
    held = true;
    entered.set_value();
    released.wait();
  };
  Worker w(o);
  w.check->submit(make_case("a", prompt, 0, {1}));
  entered.get_future().wait();
  for (const char* p : {"b", "c", "d", "e", "f"}) w.check->submit(make_case(p, prompt, 0, {1}));
  EXPECT_EQ(w.snapshot().counters.dropped, 3u);
  EXPECT_EQ(w.snapshot().counters.pending, 3u) << "two queued, one in progress";
  release.set_value();
  ASSERT_TRUE(w.completed(3));
  const SelfCheckSnapshot s = w.snapshot();
  std::vector<std::string> names;
  for (const PlanRecord& r : s.plans) names.push_back(r.plan);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "e", "f"}));
  EXPECT_EQ(s.counters.sampled, 6u);
}

// An auto plan whose answers differ from full prefill's is taken out of its policy once it has
// min_checks(0.9) = 35 checks, not at 34; a plan held to no target is never.
TEST(SelfCheck, AnAutoPlanBelowItsTargetIsTakenOutOfThePolicy) {
  CF_REQUIRE_MODEL();
  const std::vector<TokenId> prompt = prompt_tokens(9);
  TokenId first = -1;
  std::vector<TokenId> answer = reference_answer(prompt, 1, first);
  answer[0] = answer[0] == 100 ? 101 : 100;  // never full prefill's
  const autoq::AutoCalibration cal = two_policy_calibration();
  SelfCheckOptions o;
  o.share = 1;
  o.max_pending = 64;
  Worker w(o, &cal);
  auto wrong = [&] {
    SelfCheckCase c = make_case("auto@0.9:epic@0.15", prompt, first, answer);
    c.quality = 0.9;
    c.auto_step = 1;
    return c;
  };
  for (int i = 0; i < 34; ++i) w.check->submit(wrong());
  ASSERT_TRUE(w.completed(34));
  EXPECT_EQ(w.check->calibration()->policy_for(0.9, 10).steps, (std::vector<size_t>{1, 2})) << "not before 35 checks";
  w.check->submit(wrong());
  ASSERT_TRUE(w.completed(35));
  EXPECT_EQ(w.check->calibration()->policy_for(0.9, 10).steps, (std::vector<size_t>{2}));
  EXPECT_EQ(w.check->calibration()->policy_for(0.8, 10).steps, (std::vector<size_t>{0, 1}));
  const SelfCheckSnapshot s = w.snapshot();  // kept: r points into it (ASan found a temporary here)
  const PlanRecord* r = find_plan(s, "auto@0.9:epic@0.15");
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->recalibrated);
  EXPECT_EQ(r->identical, 0u);
}

// The recalibrated policy is the one the executor walks (FusionExecutor::set_calibration): with
// step 1 taken out of the policy serving 0.9, auto runs epic@0.3 then full prefill, not
// epic@0.15 first (the steps' predictions, 0.5, never reach the policy's threshold of 1).
TEST(SelfCheck, TheExecutorWalksTheCalibrationItIsGiven) {
  CF_REQUIRE_MODEL();
  const Model& m = shared_model();
  Forward fwd(m, shared_pool());
  ChunkStoreOptions so;  // memory only
  so.model = StoreModel{m.fingerprint(), m.hparams()};
  ChunkStore store(so);
  RagRequest rr;
  rr.system = m.tokenizer().encode("Answer from the passages.", true, false);
  rr.chunks = {m.tokenizer().encode("The mill stands by the river and grinds wheat.\n\n", false, false),
               m.tokenizer().encode("The miller sells flour at the market on Fridays.\n\n", false, false)};
  rr.suffix = m.tokenizer().encode("When does the miller sell flour?", false, false);
  FusionOptions fo;
  fo.method = auto_method_name();
  fo.quality = 0.9;
  auto walk = [&](const autoq::AutoCalibration& cal) {
    FusionExecutor ex(fwd, store);
    ex.set_calibration(&cal);
    std::vector<std::string> steps;
    const FusionResult r = ex.prefill(rr, fo);
    for (const auto& t : r.auto_decision["trace"])
      steps.push_back(t["method"].get<std::string>() + "@" + std::to_string(t["ratio"].get<double>()).substr(0, 4));
    return steps;
  };
  const autoq::AutoCalibration cal = two_policy_calibration();
  EXPECT_EQ(walk(cal), (std::vector<std::string>{"epic@0.15", "epic@0.30", full_method_name() + "@1.00"}));
  EXPECT_EQ(walk(without_step(cal, 0.9, 1)), (std::vector<std::string>{"epic@0.30", full_method_name() + "@1.00"}));
}

// ---- the engine's sampling of served answers ----

const std::string kSystem = "You are a helpful assistant. Answer the question using the passages, briefly.";
const std::vector<std::string> kDocs = {
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889.",
    "Mount Everest is Earth's highest mountain above sea level, located in the Himalayas.",
    "The Great Wall of China is a series of fortifications built across northern China.",
};

EngineOptions engine_options(double share, const std::string& name) {
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.threads = 2;
  o.cache_dir = (std::filesystem::temp_directory_path() / ("cf_self_check_" + name + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(o.cache_dir);
  o.self_check_share = share;
  return o;
}

CompletionRequest chat(const std::string& method, double ratio) {
  CompletionRequest r;
  r.messages = {{"system", kSystem}, {"user", "When was the Eiffel Tower completed?"}};
  for (const auto& d : kDocs) r.documents.push_back({d, ""});
  r.fusion.options.method = method;
  r.fusion.options.ratio = ratio;
  r.fusion.prefix_cache = false;
  r.max_tokens = 12;
  r.seed = 1;
  return r;
}

// Served with --self-check 1: a full request is not sampled (it is the reference); a reuse
// answer (ratio 0) is checked, and the ledger says whether it equalled full prefill's, as the
// two served answers do; EPIC at ratio 1 (full prefill's K/V) agrees.
TEST(SelfCheckEngine, ServedFusedAnswersAreCheckedWhenIdle) {
  CF_REQUIRE_MODEL();
  Engine e(engine_options(1, "on"));
  const CompletionResult full = e.complete(chat("full", 1));
  EXPECT_EQ(e.metrics().self_check.counters.sampled, 0u) << "full prefill is not checked";
  const CompletionResult reuse = e.complete(chat("reuse", 0));
  const CompletionResult epic = e.complete(chat("epic", 1.0));
  EXPECT_EQ(e.metrics().self_check.counters.sampled, 2u);
  ASSERT_TRUE(eventually([&] { return e.metrics().self_check.counters.completed >= 2; }));
  const SelfCheckSnapshot s = e.metrics().self_check;
  const PlanRecord* r = find_plan(s, "reuse@0");
  const PlanRecord* x = find_plan(s, "epic@1");
  ASSERT_TRUE(r && x);
  EXPECT_EQ(r->checked, 1u);
  EXPECT_EQ(r->identical, reuse.text == full.text ? 1u : 0u) << "reuse: " << reuse.text << " / full: " << full.text;
  EXPECT_EQ(epic.text, full.text);
  EXPECT_EQ(x->checked, 1u);
  EXPECT_EQ(x->first_token_agree, 1u);
  EXPECT_EQ(x->identical, 1u);
  // Each answer's note (GET /v1/details): its plan, sampled, the plan's record when it was served.
  EXPECT_TRUE(full.self_check.is_null());
  EXPECT_EQ(reuse.self_check["plan"], "reuse@0");
  EXPECT_EQ(reuse.self_check["sampled"], true);
  EXPECT_TRUE(reuse.self_check["record"].is_null()) << "the first answer of its plan";
  const CompletionResult again = e.complete(chat("reuse", 0));
  EXPECT_EQ(again.self_check["record"]["checked"], 1);
}

// The auto policy's answers (SmolLM2's shipped calibration runs prophet steps at q 0.1, which
// accept these): one a step accepted is checked under the plan "auto@0.1:<step>", held to 0.1;
// one full prefill answered (escalated) would not be checked.
TEST(SelfCheckEngine, AutoAnswersAreCheckedUnderTheirStepAndTarget) {
  CF_REQUIRE_MODEL();
  Engine e(engine_options(1, "auto"));
  e.complete(chat("reuse", 0));  // the chunk caches warm (cold ones make auto answer with full prefill)
  ASSERT_TRUE(eventually([&] { return e.metrics().self_check.counters.completed >= 1; }));
  size_t accepted = 0;
  for (const char* q : {"When was the Eiffel Tower completed?", "Where is Mount Everest?",
                        "What is the Great Wall of China?", "Which tower is in Paris?"}) {
    CompletionRequest req = chat(auto_method_name(), 0);
    req.messages.back().content = q;
    req.fusion.options.quality = 0.1;
    const CompletionResult r = e.complete(req);
    ASSERT_FALSE(r.auto_choice.is_null());
    const std::string method = r.auto_choice["method"];
    if (r.auto_choice["reason"] != autoq::kReasonAccepted) {
      EXPECT_TRUE(r.self_check.is_null()) << r.auto_choice.dump();
      continue;
    }
    ++accepted;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%g", r.auto_choice["ratio"].get<double>());
    EXPECT_EQ(r.self_check["plan"], "auto@0.1:" + method + "@" + ratio);
  }
  ASSERT_GT(accepted, 0u) << "no step accepted: the test needs a calibration that runs one at q 0.5";
  ASSERT_TRUE(eventually([&] { return e.metrics().self_check.counters.completed >= accepted + 1; }));
  uint64_t checked = 0;
  for (const PlanRecord& r : e.metrics().self_check.plans) {
    if (r.plan == "reuse@0") continue;
    EXPECT_EQ(r.quality, 0.1) << r.plan;
    checked += r.checked;
  }
  EXPECT_EQ(checked, accepted);
}

TEST(SelfCheckEngine, ShareZeroChecksNothing) {
  CF_REQUIRE_MODEL();
  Engine e(engine_options(0, "off"));
  EXPECT_TRUE(e.complete(chat("reuse", 0)).self_check.is_null());
  e.complete(chat("epic", 0.15));
  const SelfCheckSnapshot s = e.metrics().self_check;
  EXPECT_EQ(s.counters.sampled, 0u);
  EXPECT_TRUE(s.plans.empty());
}

}  // namespace
}  // namespace cf

// The self-check's ledger (issue 60 item 3), pure: per plan (a fixed method at its ratio, or
// the auto policy's answering step at its target), how many served fused answers were checked
// against full prefill, how many agreed on the first token and how many were identical; Wilson
// 95% intervals on both shares; the recalibration rule; which requests are sampled. No model,
// no threads beyond its own mutex: tests/serve/test_self_check.cpp holds every rule here on
// fixed numbers. serve/self_check.h runs the checks and feeds it.
//
// The recalibration rule, conservative: a plan held to a target q (auto only) is recalibrated
// once it has at least min_checks(q) checks and the Wilson interval's LOWER bound on its share
// of identical answers is below q. min_checks(q) = max(20, ceil(z^2 q / (1 - q))) is the least
// n at which a perfect record (n of n) has a lower bound n / (n + z^2) of at least q, so a plan
// that never missed is never recalibrated, and one miss early does not decide. q = 1 asks for
// every answer: the rule fires on the first difference after 20 checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace cf {

inline constexpr double kSelfCheckZ = 1.96;  // 95%

struct ShareInterval {
  double low = 0, high = 1;
};
// Wilson score interval of k successes in n trials; n == 0: [0, 1].
ShareInterval wilson_interval(uint64_t k, uint64_t n, double z = kSelfCheckZ);

// Checks before a plan held to target q may be recalibrated (above).
uint64_t min_checks(double q, double z = kSelfCheckZ);

// One check's outcome.
struct CheckOutcome {
  bool first_token_agree = false;
  bool identical = false;
};
// The fused answer against full prefill's. `fused`: the fused answer's first tokens as compared
// (at most the check's cap), `fused_eos`: it ended there on end-of-generation; `full`: full
// prefill's greedy tokens (it decodes fused.size() tokens, one more when fused_eos), `full_eos`:
// it ended on end-of-generation. Identical: the same tokens, ending the same way when the fused
// answer ended. First tokens: the top-1 of each prefill's logits.
CheckOutcome compare_answers(TokenId fused_first, TokenId full_first, std::span<const TokenId> fused, bool fused_eos,
                             std::span<const TokenId> full, bool full_eos);

// Deterministic sampling of a share of the served fused requests: the n-th eligible request is
// checked when floor(n * share) > floor((n - 1) * share) (0.2: every fifth; 1: each; 0: none).
// Not thread-safe (the engine asks on the scheduler thread).
class SelfCheckSampler {
 public:
  explicit SelfCheckSampler(double share);  // throws std::invalid_argument outside [0, 1]
  bool next();
  double share() const { return share_; }

 private:
  double share_;
  uint64_t seen_ = 0;
};

struct PlanRecord {
  std::string plan;        // e.g. "epic@0.15", "auto@0.90:epic@0.15"
  double quality = 0;      // the target it is held to (auto); 0: none, never recalibrated
  uint64_t checked = 0, first_token_agree = 0, identical = 0;
  bool recalibrated = false;  // the rule fired (once)
  ShareInterval identical_interval() const { return wilson_interval(identical, checked); }
  ShareInterval first_token_interval() const { return wilson_interval(first_token_agree, checked); }
};
// The rule above, on a record not yet recalibrated.
bool should_recalibrate(const PlanRecord& r);

// The queue's counters, beside the plans (SelfCheck fills them).
struct SelfCheckCounters {
  double share = 0;
  uint64_t sampled = 0;   // cases queued
  uint64_t dropped = 0;   // queued cases dropped, oldest first, when the queue was full
  uint64_t completed = 0; // checks run to the end
  size_t pending = 0;     // queued or in progress
};

struct SelfCheckSnapshot {
  SelfCheckCounters counters;
  std::vector<PlanRecord> plans;  // by plan name
};
nlohmann::json plan_record_json(const PlanRecord& r);               // one plan's counts and intervals
nlohmann::json self_check_json(const SelfCheckSnapshot& s);        // GET /v1/self_check
std::string self_check_prometheus(const SelfCheckSnapshot& s);     // GET /metrics' part

class SelfCheckLedger {
 public:
  // Counts one check of `plan` (held to `quality`; 0: none). True when this check made the
  // recalibration rule fire (once per plan): the caller makes the policy more conservative.
  bool record(const std::string& plan, double quality, CheckOutcome o);
  std::vector<PlanRecord> records() const;
  std::optional<PlanRecord> find(const std::string& plan, double quality) const;

 private:
  mutable std::mutex mu_;
  std::vector<PlanRecord> plans_;  // few: one per method, ratio and target served
};

}  // namespace cf

// Quality on demand (issue 26): a request names the quality it needs ("of requests like
// these, a share of at least q get an answer identical to full prefill's") and the engine
// picks the method and the recompute ratio per request.
//
// The policy is an escalation ladder, cheapest step first (e.g. reuse, then a selector at ρ
// 0.05, 0.15, 0.3), ending in full prefill, which is always right by definition. Each step runs
// the fused prefill; a per-step logistic model, calibrated offline on the model itself
// (`chunkfuse calibrate`, src/eval/calibration.h), turns what the step's first-token
// distribution reveals (its top-1 margin and its entropy) into the probability p that the
// whole greedy answer from this step equals full prefill's. For each target q the calibration
// also fixes an AutoPolicy: which steps to run and one acceptance threshold t on p, the
// cheapest on the calibration set whose share of identical answers (observed, and expected
// from the p it accepted) is at least q. The first step run with p >= t answers; if none
// does, full prefill. t is usually below q: the share counts every request, and those that
// escalate to full prefill are identical, so a step may answer some requests it is less sure
// of. No paper proposes this; the ladder's steps are the papers' selectors (selector.h), run
// unchanged.
//
// Cold chunk caches (issue 60 item 2). A ladder step reuses chunk caches; one the store lacks
// is computed first, a prefill of that chunk on the request's path, before any step starts.
// Under ColdChunks::priced (executor.h: the server) the policy prices that before it runs a
// step, in rows of the forward pass (price_cold_chunks):
//   full prefill = context + suffix tokens (S is reused by both),
//   the ladder   = cold tokens + the policy's expected share of full prefill x full prefill
//                  (AutoPolicy::ttft_share, its rejected steps included; a file without it:
//                  the first step's rows, ρ x context + suffix).
// The ladder runs only when it is the cheaper (it then computes the cold caches inline, once
// for all its steps); a request whose chunks are all cold never runs it (computing every chunk
// costs the context part of full prefill already, and each step adds to it). Otherwise full
// prefill answers at once (reason "cold_chunks" in the decision) and the caches it did not
// compute come back in FusionResult::chunks_to_fill; the server computes them when idle, after
// the answer, so the next request finds them warm. A cache on disk or in the remote tier counts
// as warm: its load is prefetched while the request waits and costs milliseconds against a
// prefill's hundreds. Under ColdChunks::offline (the bench, `ask`) nothing changes: cold caches
// are computed inside the step and timed apart, as for every fixed method.
//
// Calibrations are per model (the fingerprint is checked, another model's file is refused):
// <cache_root>/calibrations/<fingerprint>.auto.json written by `chunkfuse calibrate`, else one
// shipped in data/auto_calibrations/ (compiled in, like the QCFuse profiles).
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fusion/cost_model.h"
#include "fusion/executor.h"

namespace cf::autoq {

inline constexpr const char* kCalibrationFormat = "chunkfuse.auto.calibration/3";  // /2 (one size class) is read too

// What one fused prefill's first-token logits say about its answer.
struct FirstTokenSignals {
  double margin = 0;   // p(top-1) - p(top-2) after softmax
  double entropy = 0;  // nats
  int32_t top1 = -1;
};
FirstTokenSignals first_token_signals(std::span<const float> logits);

// The predictor's inputs for one step, in the order of AutoStep::weights[1..].
std::vector<double> predictor_features(const FirstTokenSignals& s);
inline constexpr size_t kFeatureCount = 2;

// Logistic regression P(y = 1 | x) = σ(w0 + w·x), fitted by Newton's method with an L2
// penalty `l2` on w (not on the intercept). Throws std::invalid_argument on ragged input.
std::vector<double> fit_logistic(const std::vector<std::vector<double>>& x, const std::vector<int>& y, double l2 = 1.0);
double logistic(const std::vector<double>& weights, const std::vector<double>& x);

struct AutoStep {
  std::string method;  // a selector name (selector.h)
  double ratio = 0;
  nlohmann::json options = nlohmann::json::object();
  std::vector<double> weights;  // intercept, then one per predictor_features()
};

// What the calibration chose for the targets up to `quality`: the ladder steps to run (their
// indices, cheapest first; none: full prefill for every request) and the probability at which
// a step's answer is accepted; with what it achieved on the calibration set.
struct AutoPolicy {
  double quality = 1.0;
  std::vector<size_t> steps;
  double threshold = 1.0;
  double expected_share = 1.0;  // mean over requests of p where a step answered, 1 elsewhere
  double observed_share = 1.0;  // answers identical to full prefill's (escalations count as identical)
  double ttft_share = 1.0;      // mean TTFT, steps run and discarded included, over full prefill's
};

// The plan for requests of one size: from `min_context_tokens` context tokens up to the next
// class's bound. A request's size is known before any step runs, and a plan priced on short
// prompts does not carry to long ones (their steps cost more and are accepted less often:
// docs/benchmarks-history.md, musique_s with a HotpotQA calibration); the predictors are shared.
struct SizeClass {
  size_t min_context_tokens = 0;
  size_t examples = 0;  // calibration requests the class was planned on
  // Ascending quality; each serves every target above the previous one's quality and up to
  // its own (runs of grid targets with the same choice are stored once).
  std::vector<AutoPolicy> policies;
  // The index of the policy serving target `quality`: the first whose quality is at least it;
  // policies.size() above every stored one (full prefill).
  size_t policy_index(double quality) const;
};

struct AutoCalibration {
  std::string fingerprint;  // Model::fingerprint_hex()
  std::vector<AutoStep> steps;  // cheapest first; full prefill is the implicit last step
  std::vector<SizeClass> size_classes;  // ascending bounds, the first from 0 tokens
  nlohmann::json provenance = nlohmann::json::object();  // dataset, examples, when, fit quality
  std::string source;  // where it was read from (for messages)

  // Throws std::invalid_argument naming `source` and the field on a malformed file.
  static AutoCalibration parse(const nlohmann::json& j, const std::string& source);
  nlohmann::json to_json() const;
  double predict(size_t step, const FirstTokenSignals& s) const;
  // The class of a request of `context_tokens` tokens.
  const SizeClass& size_class(size_t context_tokens) const;
  // The policy of that class for target `quality`: the first whose quality is at least it;
  // above every stored one, full prefill.
  const AutoPolicy& policy_for(double quality, size_t context_tokens) const;
};

// One calibration request as the planner sees it: per ladder step, its predicted probability,
// whether its answer was identical to full prefill's, and its TTFT; and full prefill's TTFT.
struct PlanCase {
  std::vector<double> predicted;
  std::vector<bool> identical;
  std::vector<double> step_ms;
  double full_ms = 0;
};
// For every target on a grid of 0.01, the cheapest (mean TTFT) choice of a subset of the
// ladder and a threshold whose observed and expected shares on `cases` both reach the target;
// consecutive targets with the same choice are merged. Throws std::invalid_argument on ragged
// cases or a ladder longer than kMaxLadderSteps (every subset is tried).
inline constexpr size_t kMaxLadderSteps = 8;
std::vector<AutoPolicy> plan_policies(const std::vector<PlanCase>& cases);

// `policy` replayed on a recorded request: which ladder step answered (-1: full prefill), the
// TTFT it paid (rejected steps included) and the part spent on rejected steps. The planner
// and the offline replay (eval::evaluate_policy) walk with it; the engine's prefill() runs the
// same walk live, one step at a time.
struct PlanOutcome {
  int answered = -1;
  double spent_ms = 0;
  double rejected_ms = 0;
};
PlanOutcome walk(const AutoPolicy& policy, const PlanCase& c);

// The calibration of the model with this fingerprint: the cache's, else the bundled one;
// nullopt when there is none. A file whose fingerprint is another model's is refused
// (std::runtime_error naming both), never used.
std::optional<AutoCalibration> find_calibration(const std::string& fingerprint_hex);
std::string calibration_cache_path(const std::string& fingerprint_hex);
// find_calibration, looked up once per model and process (the engine's, the executor's):
// a calibration written while a server runs is used after its restart. nullptr: none.
const AutoCalibration* shared_calibration(const std::string& fingerprint_hex);
// Reads one file and checks it belongs to `fingerprint_hex`.
AutoCalibration load_calibration_file(const std::string& path, const std::string& fingerprint_hex);

// Throws std::invalid_argument naming the field: quality must be in (0, 1].
void check_quality(double quality);

// The decision, pure: whether a step of `policy` that predicted `p` answers (the engine, the
// planner and the replay all decide with it).
bool accepts(const AutoPolicy& policy, double p);

// The cold-chunk rule above, pure: the two prices in forward-pass rows for a request of
// `context_tokens` (of which `cold_tokens` in chunks the store lacks) and `suffix_tokens`,
// under `policy` (non-empty steps) of `cal`.
struct ColdPrice {
  double full_rows = 0;
  double ladder_rows = 0;
  bool all_cold = false;
  bool ladder() const { return !all_cold && ladder_rows < full_rows; }
};
ColdPrice price_cold_chunks(const AutoCalibration& cal, const AutoPolicy& policy, size_t context_tokens,
                            size_t suffix_tokens, size_t cold_tokens);

// Why the decision is what it is (AutoDecision::reason).
inline constexpr const char* kReasonAccepted = "accepted";        // a step's p reached the threshold
inline constexpr const char* kReasonEscalated = "escalated";      // every step run was rejected
inline constexpr const char* kReasonTarget = "target";            // the target's policy runs no step
inline constexpr const char* kReasonColdChunks = "cold_chunks";   // computing the cold caches first costs more
inline constexpr const char* kReasonNoContext = "no_context";     // no chunk to reuse
inline constexpr const char* kReasonUncalibrated = "uncalibrated";  // no calibration for this model
inline constexpr const char* kReasonBudget = "budget";            // the ttft_ms budget chose the answer

// A first-token budget (fusion.ttft_ms, issue 60 item 1). The ladder is cheapest first and, as
// calibrated, better further up; full prefill is the best. Each plan's time is predicted by
// this machine's cost model (cost_model.h) from its rows: a step's ρ x context + suffix (the
// first step run also computes the cold caches), full prefill's context + suffix.
//  - ttft_ms alone: the best plan that fits, accepted whatever its prediction (full prefill,
//    else the highest step that fits).
//  - quality and ttft_ms: the quality target's policy (the cheapest plan meeting it; full
//    prefill when cold caches make its walk dearer, the rule above), its steps run while they fit; if the whole walk, escalation to full prefill included, fits, the
//    target binds; otherwise the budget does, and the walk ends with the best answer that fits
//    what is left (full prefill, else the highest step above those run, else the last step run).
//  - nothing fits: the cheapest step answers (bound "ttft_unmet").
// Between steps the walk does not re-time itself: predicted and actual TTFT are both reported,
// and each prefill refreshes the cost model.
inline constexpr const char* kBoundQuality = "quality";        // the target's plan fits the budget whole
inline constexpr const char* kBoundTtft = "ttft";              // the budget cut the plan short
inline constexpr const char* kBoundTtftUnmet = "ttft_unmet";   // even the cheapest plan is over the budget
inline constexpr const char* kBoundNone = "none";              // ttft_ms alone, and full prefill fits
struct BudgetPlan {
  std::vector<size_t> steps;  // ladder steps run in order, each answering if the policy accepts it
  int final_step = -1;        // then this step answers, whatever its prediction
  bool full = false;          // else full prefill (false, no final step: the last step run answers)
  std::string bound = kBoundNone;
  double predicted_ms = 0;    // the walk's longest path
};
// `policy` null: ttft_ms alone. Pure; throws std::invalid_argument on a budget <= 0.
BudgetPlan plan_budget(const AutoCalibration& cal, const AutoPolicy* policy, const CostModel& cost,
                       size_t context_tokens, size_t suffix_tokens, size_t cold_tokens, double budget_ms);

// What the auto policy chose, reported in the response (chunkfuse.auto).
struct AutoDecision {
  std::string method;  // the chosen step's selector, or "full"
  double ratio = 1.0;
  double predicted_quality = 1.0;
  double quality = 1.0;        // the target asked for
  double threshold = 1.0;      // the policy's acceptance threshold for that target
  size_t size_class = 0;       // the lower bound (context tokens) of the request's size class
  double decision_ms = 0;      // steps run and discarded + the predictor's own time
  size_t steps_run = 0;
  bool calibrated = true;      // false: no calibration for this model, full prefill answered
  std::string reason;          // kReason*
  size_t cold_chunks = 0, cold_tokens = 0;  // ColdChunks::priced: chunk caches the store lacked
  std::optional<ColdPrice> cold_price;      // priced when some were cold
  double ttft_budget_ms = 0;                // fusion.ttft_ms (0: none; then the next three are not reported)
  std::string bound;                        // kBound*
  double predicted_ttft_ms = 0;             // the plan's, by the cost model
  double actual_ttft_ms = 0;                // the prefill's: steps run and discarded, and the chunk
                                            // caches they computed (offline_ms, waited for on a server)
  nlohmann::json trace = nlohmann::json::array();  // per step run: method, ratio, predicted, ttft_ms
  nlohmann::json to_json() const;
};

// Runs the ladder for `request` (base: seed, chunk variant; method and ratio are the
// policy's). Without a calibration (`cal` null) it answers with full prefill and says so.
// Under the executor's ColdChunks::priced, cold chunk caches are priced first (above). With
// base.ttft_ms the budget's plan runs (above; `cost` required, refreshed by every prefill run);
// quality may then be 0 (no target).
FusionResult prefill(FusionExecutor& executor, const RagRequest& request, const FusionOptions& base,
                     const AutoCalibration* cal, double quality, AutoDecision& decision,
                     SharedCostModel* cost = nullptr);

}  // namespace cf::autoq

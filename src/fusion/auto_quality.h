// Quality on demand (issue 26): a request names the quality it needs ("an answer identical
// to full prefill's with probability at least q") and the engine picks the method and the
// recompute ratio per request.
//
// The policy is an escalation ladder, cheapest step first (e.g. prophet at ρ 0.05, 0.15,
// 0.3), ending in full prefill, which is always right by definition. Each step runs the
// fused prefill; a per-step logistic model, calibrated offline on the model itself
// (`chunkfuse calibrate`, src/eval/calibration.h), turns what the step's first-token
// distribution reveals (its top-1 margin and its entropy) into the probability that the
// whole greedy answer from this step equals full prefill's. The first step whose
// probability reaches q answers; a step whose calibrated probabilities never reached q is
// skipped (it could only cost time). No paper proposes this; the ladder's steps are the
// papers' selectors (selector.h), run unchanged.
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

#include "fusion/executor.h"

namespace cf::autoq {

inline constexpr const char* kMethodName = "auto";
inline constexpr const char* kCalibrationFormat = "chunkfuse.auto.calibration/1";

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
  double max_predicted = 0;     // the highest probability it gave on the calibration set
  // What it cost and answered on the calibration set, for worth_running(): every probability
  // it gave there (ascending), and its mean TTFT as a share of full prefill's. Empty / 0 in
  // files written before they were recorded (then max_predicted alone decides).
  std::vector<double> predictions;
  double ttft_share = 0;
};

struct AutoCalibration {
  std::string fingerprint;  // Model::fingerprint_hex()
  std::vector<AutoStep> steps;  // cheapest first; full prefill is the implicit last step
  nlohmann::json provenance = nlohmann::json::object();  // dataset, examples, when, fit quality
  std::string source;  // where it was read from (for messages)

  // Throws std::invalid_argument naming `source` and the field on a malformed file.
  static AutoCalibration parse(const nlohmann::json& j, const std::string& source);
  nlohmann::json to_json() const;
  double predict(size_t step, const FirstTokenSignals& s) const;
};

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

// The decision, pure: given the steps run so far, whether step `step` (just run, with
// signals `s`) answers at target `quality`; and whether a step is worth running at all: it
// must have reached `quality` on the calibration set, and answer there a larger share of the
// requests than the share of full prefill's time it costs (else running it loses time on
// average: it costs that share on every request and saves the rest only on those it answers).
bool accepts(const AutoCalibration& cal, size_t step, const FirstTokenSignals& s, double quality);
bool worth_running(const AutoCalibration& cal, size_t step, double quality);

// What the auto policy chose, reported in the response (chunkfuse.auto).
struct AutoDecision {
  std::string method;  // the chosen step's selector, or "full"
  double ratio = 1.0;
  double predicted_quality = 1.0;
  double quality = 1.0;        // the target asked for
  double decision_ms = 0;      // steps run and discarded + the predictor's own time
  size_t steps_run = 0;
  bool calibrated = true;      // false: no calibration for this model, full prefill answered
  nlohmann::json trace = nlohmann::json::array();  // per step run: method, ratio, predicted, ttft_ms
  nlohmann::json to_json() const;
};

// Runs the ladder for `request` (base: seed, chunk variant; method and ratio are the
// policy's). Without a calibration (`cal` null) it answers with full prefill and says so.
FusionResult prefill(FusionExecutor& executor, const RagRequest& request, const FusionOptions& base,
                     const AutoCalibration* cal, double quality, AutoDecision& decision);

}  // namespace cf::autoq

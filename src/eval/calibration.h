// Calibrating and evaluating the auto policy (issue 26; fusion/auto_quality.h).
//
// record_examples runs, per example of a dataset split, full prefill and every ladder step
// (fused prefill, then the greedy answer as the bench decodes it) and appends one JSON line
// per example to a records file: each step's first-token signals, its TTFT, whether its
// answer is identical to full prefill's, and (for the report, not the predictor) its
// first-token KL from full prefill and from the previous step, how far its recomputation
// moved the K/V from a reuse step's cache (`kv_change`, per layer; after a reuse step only)
// and its selector's score mass (`scores`: sum, share held by the recomputed rows).
// Resumable: examples already in the file are skipped.
//
// fit_calibration fits each step's logistic model on one split's records; evaluate_policy
// replays the policy's decisions (the same functions the engine calls) on another split's
// records, for each quality target, against every fixed (method, ratio) policy;
// cross_validate does both fold by fold, every record replayed by a calibration fitted without it.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "eval/datasets.h"
#include "fusion/auto_quality.h"
#include "fusion/rag_prompt.h"

namespace cf {
class Model;
class Forward;
}  // namespace cf

namespace cf::eval {

struct LadderStep {
  std::string method;
  double ratio = 0;
};
// "prophet:0.05,prophet:0.15" -> steps; throws std::invalid_argument naming the bad entry
// (an unknown selector, "full", a ratio outside [0, 1]).
std::vector<LadderStep> parse_ladder(const std::string& text);
// Reuse first (~3% of full prefill: only the question is computed), then EPIC, the selector
// without a scoring pass, best or tied at ρ 0.15 on the Qwen 1.5B HotpotQA rows (docs/benchmarks-history.md).
inline constexpr const char* kDefaultLadder = "reuse:0,epic:0.05,epic:0.15,epic:0.3";

struct CalibrationRunOptions {
  std::vector<LadderStep> ladder;
  size_t first = 0;   // examples [first, first + limit) of the dataset
  size_t limit = 0;   // 0: to the end
  int max_tokens = 32;
  RagPromptOptions prompt;
  size_t chunk_tokens = 0;        // 0: one chunk per passage; N: fixed-size chunks (bench_request.h)
  size_t chunks_per_request = 0;  // > 0: exactly this many chunks (the paper's 20 x 512)
  ChunkContext chunk_context = ChunkContext::alone;
  std::string records_path;
  bool progress = true;
};

// Runs what is missing from options.records_path; returns how many examples it ran.
size_t record_examples(const Model& model, Forward& fwd, const Dataset& dataset, const CalibrationRunOptions& options);

// Every line of a records file (throws std::runtime_error naming the file and line).
std::vector<nlohmann::json> read_records(const std::string& path);

// The records of several files as one set: a request recorded in more than one (runs of
// different ladders on the same split) becomes one record with the union of their steps (a
// step in both: the first file's). Throws std::invalid_argument where two runs of a request
// disagree on its model, prompt words or full prefill's answer (not the same request then).
std::vector<nlohmann::json> join_records(const std::vector<std::string>& paths);

// The records with only the steps of `ladder`, in its order: records of a longer ladder (say
// EPIC's and ProphetKV's steps in one run) serve a calibration of any of its sub-ladders.
// Throws std::invalid_argument naming the record and the step it lacks.
std::vector<nlohmann::json> select_steps(const std::vector<nlohmann::json>& records, const std::vector<LadderStep>& ladder);

// One logistic model per step from these records (all of one model and ladder; throws
// std::invalid_argument otherwise), and a plan per size class: `size_bounds` (ascending
// context-token counts) split the records into classes [0, b1), [b1, b2), ..., each planned on
// its own records (at least kMinClassExamples of them where there are several classes, else
// std::invalid_argument).
inline constexpr size_t kMinClassExamples = 10;
autoq::AutoCalibration fit_calibration(const std::vector<nlohmann::json>& records, double l2 = 1.0,
                                       const std::vector<size_t>& size_bounds = {});

// The policy replayed on `records` (their steps selected by the calibration's ladder) for each target: observed share of answers identical to
// full prefill's (Wilson 95% interval), mean / p90 TTFT, decision cost, the cheapest fixed
// policy reaching the same share; plus the fixed policies and a reliability table.
nlohmann::json evaluate_policy(const std::vector<nlohmann::json>& records, const autoq::AutoCalibration& calibration,
                               const std::vector<double>& targets);

// K-fold cross-validation of calibrating and replaying: `held_out` (sorted by dataset and
// example index) is cut into `folds` contiguous parts, and each part is replayed with a
// calibration fitted on the other parts plus `fit_also` (records that are only ever fitted on,
// e.g. another dataset's, for the other size class). One report as evaluate_policy's over every
// held-out record, each replayed by a calibration that never saw it (its p90 TTFT and
// reliability bins pooled, which per-fold reports cannot give), with each fold's plans
// (`fold_policies`) instead of one calibration's, and `cross_validation`: folds, records
// fitted on besides. Throws std::invalid_argument as fit_calibration and evaluate_policy do,
// and for fewer than 2 folds or more folds than records.
struct CrossValidation {
  size_t folds = 5;
  std::vector<LadderStep> ladder;  // empty: the records' own steps
  double l2 = 1.0;
  std::vector<size_t> size_bounds;
};
nlohmann::json cross_validate(const std::vector<nlohmann::json>& held_out, const std::vector<nlohmann::json>& fit_also,
                              const CrossValidation& cv, const std::vector<double>& targets);

}  // namespace cf::eval

// `chunkfuse calibrate`: the auto policy's per-model calibration (issue 26; fusion/auto_quality.h,
// eval/calibration.h). Two jobs:
//   record and fit   run full prefill and every ladder step on a dataset split (resumable
//                    records file), then fit the per-step predictors and write the calibration
//                    (<cache>/calibrations/<fingerprint>.auto.json by default, which the engine reads)
//   --fit RECORDS... fit and write the calibration from records files alone (no model, nothing run);
//                    with --ladder, on those of the records' steps only
//   --evaluate RECORDS...  replay the policy on another split's records: observed share of answers
//                    identical to full prefill's per target, TTFT against every fixed policy,
//                    a reliability table (JSON report; tools/auto_quality_report.py plots it)
//   --cross-validate K --evaluate RECORDS... [--fit RECORDS...]  the same report, every record of
//                    --evaluate replayed by a calibration fitted on the other folds (and --fit's)
#include <cstdio>
#include <filesystem>

#include "apps/app_common.h"
#include "base/paths.h"
#include "eval/calibration.h"
#include "kv/store_paths.h"
#include "runtime/forward.h"

namespace cf::apps {
namespace {

struct CalibrateArgs {
  ModelOptions model;
  std::string dataset = "hotpotqa";
  std::string data_dir;
  size_t first = 0, limit = 80;
  std::string ladder = eval::kDefaultLadder;
  bool ladder_given = false;  // with --fit: fit on these steps of the records only
  std::vector<size_t> size_bounds;  // --size-classes: a plan per request size
  std::string records;
  std::string out;
  bool no_fit = false;
  double l2 = 1.0;
  int max_tokens = 32;
  size_t chunk_tokens = 0, chunks = 0;
  std::string chunk_context = "alone";
  RagPromptOptions prompt;
  std::vector<std::string> fit;  // --fit RECORDS...
  // --evaluate
  std::vector<std::string> evaluate;  // records files, joined (eval::join_records)
  std::string calibration;
  size_t cross_validate = 0;  // --cross-validate K: K folds of the --evaluate records
  std::string report;
  std::string targets = "0.8,0.9,0.95,0.99";
};

void write_json(const std::string& path, const nlohmann::json& j) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  write_private_file_atomic(p, j.dump(2) + "\n");
}

void print_report(const nlohmann::json& report) {
  std::printf("%zu examples of %s; fixed policies:\n", report["examples"].get<size_t>(), report["fingerprint"].get<std::string>().c_str());
  for (const auto& f : report["fixed"])
    std::printf("  %-10s rho %.2f  identical %.3f [%.3f, %.3f]  mean TTFT %7.0f ms\n", f["method"].get<std::string>().c_str(),
                f["ratio"].get<double>(), f["share"].get<double>(), f["share_low"].get<double>(),
                f["share_high"].get<double>(), f["mean_ttft_ms"].get<double>());
  std::printf("auto policy%s:\n", report.contains("cross_validation")
                                       ? (", each record replayed by a calibration fitted without it (" +
                                          std::to_string(report["cross_validation"]["folds"].get<size_t>()) + " folds)")
                                             .c_str()
                                       : "");
  for (const auto& t : report["auto"])
    std::printf("  q %.2f  identical %.3f [%.3f, %.3f]  mean TTFT %7.0f ms (p90 %7.0f)  decision %5.0f ms  "
                "vs cheapest fixed (%s %.2f, %.0f ms): %.2fx  %s\n",
                t["target"].get<double>(), t["share"].get<double>(), t["share_low"].get<double>(), t["share_high"].get<double>(),
                t["mean_ttft_ms"].get<double>(), t["p90_ttft_ms"].get<double>(), t["decision_ms"].get<double>(),
                t["cheapest_fixed"]["method"].get<std::string>().c_str(), t["cheapest_fixed"]["ratio"].get<double>(),
                t["cheapest_fixed"]["mean_ttft_ms"].get<double>(), t["speedup_vs_cheapest_fixed"].get<double>(),
                t["meets_target"].get<bool>()               ? "meets"
                : t["interval_reaches_target"].get<bool>() ? "below (its interval reaches the target)"
                                                            : "MISSES");
}

int run_evaluate(const CalibrateArgs& a) {
  const auto records = eval::join_records(a.evaluate);
  if (records.empty()) throw std::invalid_argument(a.evaluate.front() + ": no records");
  const std::vector<double> targets = parse_ratio_list(a.targets, "--targets");
  nlohmann::json report;
  if (a.cross_validate > 0) {
    if (!a.calibration.empty())
      throw std::invalid_argument("--cross-validate fits a calibration per fold: --calibration does not apply");
    eval::CrossValidation cv;
    cv.folds = a.cross_validate;
    if (a.ladder_given) cv.ladder = eval::parse_ladder(a.ladder);
    cv.l2 = a.l2;
    cv.size_bounds = a.size_bounds;
    report = eval::cross_validate(records, a.fit.empty() ? std::vector<nlohmann::json>{} : eval::join_records(a.fit), cv, targets);
  } else {
    if (a.calibration.empty()) throw std::invalid_argument("--evaluate needs --calibration FILE (or --cross-validate K)");
    if (!a.fit.empty()) throw std::invalid_argument("--evaluate replays a calibration file: --fit applies with --cross-validate only");
    const std::string fp = records.front().at("fingerprint").get<std::string>();
    report = eval::evaluate_policy(records, autoq::load_calibration_file(a.calibration, fp), targets);
  }
  print_report(report);
  if (!a.report.empty()) {
    write_json(a.report, report);
    std::printf("report written to %s\n", a.report.c_str());
  }
  return 0;
}

// Fits the per-step predictors and the per-target policies on a records file and writes the
// calibration (default: the cache's file for the records' model, which the engine reads).
int fit_and_write(const CalibrateArgs& a, const std::vector<std::string>& records_paths, const std::string& fingerprint,
                  const nlohmann::json& provenance) {
  std::vector<nlohmann::json> records = eval::join_records(records_paths);
  nlohmann::json files = nlohmann::json::array();
  for (const auto& path : records_paths) files.push_back(std::filesystem::path(path).filename().string());
  if (a.ladder_given) records = eval::select_steps(records, eval::parse_ladder(a.ladder));
  autoq::AutoCalibration cal = eval::fit_calibration(records, a.l2, a.size_bounds);  // refuses records of two models or ladders
  if (!fingerprint.empty() && cal.fingerprint != fingerprint)
    throw std::invalid_argument(records_paths.front() + " holds records of model " + cal.fingerprint + ", not of this model (" +
                                fingerprint + ")");
  cal.provenance.update(provenance);
  cal.provenance["records_files"] = files;
  const std::string out = a.out.empty() ? autoq::calibration_cache_path(cal.fingerprint) : a.out;
  write_json(out, cal.to_json());
  for (const auto& f : cal.provenance["fit"])
    std::printf("  %-10s rho %.2f  identical on %.3f of the calibration set, log-loss %.3f\n",
                f["method"].get<std::string>().c_str(), f["ratio"].get<double>(), f["identical_share"].get<double>(),
                f["log_loss"].get<double>());
  for (const auto& k : cal.size_classes) {
    if (cal.size_classes.size() > 1)
      std::printf("  requests of %zu+ context tokens (%zu calibration requests):\n", k.min_context_tokens, k.examples);
    for (double q : {0.8, 0.9, 0.95, 0.99}) {
      const autoq::AutoPolicy& p = cal.policy_for(q, k.min_context_tokens);
      std::string steps;
      for (size_t s : p.steps) steps += (steps.empty() ? "" : ", ") + cal.steps[s].method + " " + std::to_string(cal.steps[s].ratio).substr(0, 4);
      std::printf("  q %.2f: %s, accept at p >= %.3f; on the calibration set identical %.3f at %.2f of full prefill's TTFT\n", q,
                  steps.empty() ? "full prefill" : ("run " + steps).c_str(), p.threshold, p.observed_share, p.ttft_share);
    }
  }
  std::printf("calibration written to %s\n", out.c_str());
  return 0;
}

int run_calibrate(const CalibrateArgs& a) {
  if (a.cross_validate > 0 && a.evaluate.empty()) throw std::invalid_argument("--cross-validate needs --evaluate RECORDS...");
  if (!a.evaluate.empty()) return run_evaluate(a);
  if (!a.fit.empty()) return fit_and_write(a, a.fit, "", nlohmann::json::object());
  eval::CalibrationRunOptions o;
  o.ladder = eval::parse_ladder(a.ladder);
  o.first = a.first;
  o.limit = a.limit;
  o.max_tokens = a.max_tokens;
  o.chunk_tokens = a.chunk_tokens;
  o.chunks_per_request = a.chunks;
  o.prompt = a.prompt;
  if (!parse_chunk_context(a.chunk_context, o.chunk_context)) throw std::invalid_argument("--chunk-context: alone or prefixed");
  auto model = load_model(a.model);
  const eval::Dataset data = eval::load_dataset(a.dataset, a.data_dir, 0, &model->tokenizer());
  o.records_path = a.records.empty() ? cache_root() + "/calibrations/" + model->fingerprint_hex() + "." + data.name + ".records.jsonl"
                                     : a.records;
  if (std::filesystem::path(o.records_path).has_parent_path())
    std::filesystem::create_directories(std::filesystem::path(o.records_path).parent_path());
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  std::fprintf(stderr, "calibrating on %s examples [%zu, %zu): full prefill and %zu ladder steps each; records in %s\n",
               data.name.c_str(), a.first, a.first + a.limit, o.ladder.size(), o.records_path.c_str());
  const size_t ran = eval::record_examples(*model, fwd, data, o);
  std::fprintf(stderr, "%zu examples run (the others were already recorded)\n", ran);
  if (a.no_fit) return 0;
  return fit_and_write(a, {o.records_path}, model->fingerprint_hex(),
                       {{"split", {{"dataset", data.name}, {"first", a.first}, {"limit", a.limit}}},
                        {"model_file", std::filesystem::path(a.model.model_path).filename().string()}});
}

}  // namespace

void add_calibrate_command(CLI::App& app, CommandRunner& run) {
  auto [a, cmd] = add_model_subcommand<CalibrateArgs>(
      app, "calibrate", "calibrate the auto policy (\"method\": \"auto\", \"quality\": q) on a model, or evaluate it");
  cmd->add_option("--dataset", a->dataset, "dataset name or file (as `bench`)")->capture_default_str();
  cmd->add_option("--data-dir", a->data_dir, "folder of the named datasets (default: ../shared/datasets)");
  cmd->add_option("--first", a->first, "first example of the split")->capture_default_str();
  cmd->add_option("--limit", a->limit, "examples in the split (0: to the end)")->capture_default_str();
  cmd->add_option("--ladder", a->ladder, "escalation steps before full prefill, cheapest first (method:ratio,...); with --fit: "
                  "the records' steps to fit on (default: all of them)")
      ->capture_default_str();
  cmd->add_option("--records", a->records, "records file (JSON Lines, resumable; default: <cache>/calibrations/<fingerprint>.<dataset>.records.jsonl)");
  cmd->add_option("--out", a->out, "calibration file (default: <cache>/calibrations/<fingerprint>.auto.json)");
  cmd->add_flag("--no-fit", a->no_fit, "only record the examples");
  cmd->add_option("--size-classes", a->size_bounds,
                  "context-token bounds of the size classes, each planned on its own records (e.g. 3000: one plan for "
                  "shorter requests, one for longer; default: one plan for all)")
      ->delimiter(',');
  cmd->add_option("--l2", a->l2, "L2 penalty of the logistic fits")->check(CLI::Range(0.0, 1e6))->capture_default_str();
  cmd->add_option("--max-tokens", a->max_tokens, "answer tokens (greedy, to the first newline)")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--chunk-tokens", a->chunk_tokens, "0: a chunk per passage; N: fixed-size chunks")->capture_default_str();
  cmd->add_option("--chunks", a->chunks, "exactly this many chunks per request (with --chunk-tokens: the paper's 20 x 512)")
      ->capture_default_str();
  cmd->add_option("--chunk-context", a->chunk_context, "chunk caches: alone or prefixed")->capture_default_str();
  add_prompt_options(*cmd, a->prompt);  // fit on the words the served prompts will carry
  cmd->add_option("--fit", a->fit,
                  "records files: fit the calibration from them alone (no model is loaded, nothing is run); a request in "
                  "several (runs of other ladders) is joined into one record with all their steps");
  cmd->add_option("--evaluate", a->evaluate,
                  "records files of another split: replay the policy on them instead of calibrating (joined as with --fit)");
  cmd->add_option("--calibration", a->calibration, "with --evaluate: the calibration file to replay");
  cmd->add_option("--cross-validate", a->cross_validate,
                  "with --evaluate: cut its records into K folds and replay each with a calibration fitted on the others "
                  "(plus the --fit records, never replayed), one pooled report; --ladder, --size-classes and --l2 apply to the fits")
      ->check(CLI::Range(2, 1000));
  cmd->add_option("--report", a->report, "with --evaluate: write the JSON report here");
  cmd->add_option("--targets", a->targets, "with --evaluate: quality targets")->capture_default_str();
  cmd->callback([&run, a = a, cmd = cmd] {
    a->ladder_given = cmd->count("--ladder") > 0;
    run = [a] { return run_calibrate(*a); };
  });
}

}  // namespace cf::apps

// `chunkfuse deviation`: layer-wise K/V deviation from full prefill (issue 14, item 3) for
// reuse, the enriched caches (fusionrag at ratio 0) and each selector's output, on both
// chunk contexts (alone, prefixed), over the first examples of a dataset: <out>/deviation.csv, then
// tools/deviation_report.py writes the per-layer means (deviation_summary.csv), a table of
// chosen layers with the change against reuse (deviation.md) and the plots.
#include <cstdio>

#include "apps/app_common.h"
#include "eval/deviation.h"
#include "eval/runner.h"

namespace cf::apps {
namespace {

struct DeviationArgs {
  ModelOptions model;
  std::string data;
  std::string data_dir;
  std::string methods = "reuse,fusionrag,epic,cacheblend,prophet,qcfuse,cachecraft";
  std::string ratios = "0,0.15";
  std::string chunk_contexts = "alone,prefixed";
  size_t limit = 4;
  std::string out;
  std::string store;
  std::string method_options;
  std::string python;
  bool no_report = false;
};

int run_deviation_command(const DeviationArgs& a) {
  eval::DeviationConfig cfg;
  cfg.methods = split_list(a.methods);
  cfg.ratios = parse_ratio_list(a.ratios);
  if (cfg.ratios.empty()) throw std::runtime_error("--ratios: give at least one ratio");
  cfg.chunk_contexts = parse_chunk_context_list(a.chunk_contexts, "--chunk-contexts");
  cfg.limit = a.limit;
  cfg.out_dir = a.out;
  cfg.store_dir = a.store;
  if (!a.method_options.empty()) {
    cfg.method_options = nlohmann::json::parse(a.method_options, nullptr, false);
    if (!cfg.method_options.is_object())
      throw std::runtime_error("--method-options: expected a JSON object {\"method\": {options}}");
  }
  auto model = load_model(a.model);
  const eval::Dataset dataset = eval::load_dataset(a.data, a.data_dir, 0, &model->tokenizer());
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  const std::string csv = eval::run_deviation(fwd, dataset, cfg);
  std::printf("\n%s\n", csv.c_str());
  if (a.no_report) return 0;
  std::string how_to;
  const int rc = eval::run_tool_script("tools/deviation_report.py", a.out, how_to, a.python);
  if (rc < 0) std::printf("report not written: %s\n", how_to.c_str());
  else if (rc != 0) throw std::runtime_error("the report script failed (exit " + std::to_string(rc) + "): " + how_to);
  return 0;
}

}  // namespace

void add_deviation_command(CLI::App& app, CommandRunner& run) {
  auto [a, cmd] = add_model_command<DeviationArgs>(
      app, run, "deviation", "per-layer relative L2 distance of K and V from full prefill, per method and chunk context",
      run_deviation_command);
  cmd->add_option("--data", a->data, "dataset (as `bench --data`: hotpotqa, musique_s, a file, ...)")->required();
  cmd->add_option("--data-dir", a->data_dir, "folder of the named datasets (as bench)");
  cmd->add_option("--methods", a->methods, "comma-separated selectors (reuse runs at ratio 0 only)")
      ->capture_default_str();
  cmd->add_option("--ratios", a->ratios, "comma-separated recompute ratios (fusionrag at 0 = its enriched caches)")
      ->capture_default_str();
  cmd->add_option("--chunk-contexts,--chunk-variants", a->chunk_contexts, "chunk contexts: alone and/or prefixed")->capture_default_str();
  cmd->add_option("--limit", a->limit, "first N examples")->check(CLI::Range(size_t{1}, size_t{100000}))->capture_default_str();
  cmd->add_option("--method-options", a->method_options, "JSON object of per-method options (as bench)");
  cmd->add_option("--store", a->store, "chunk-cache store folder (default: memory only)");
  cmd->add_option("--out", a->out, "output folder (deviation.csv, deviation_summary.csv, deviation.md, plots)")
      ->required();
  cmd->add_option("--python", a->python, "Python with matplotlib for the report (default: <repo>/.venv/bin/python)");
  cmd->add_flag("--no-report", a->no_report, "do not run tools/deviation_report.py");
}

}  // namespace cf::apps

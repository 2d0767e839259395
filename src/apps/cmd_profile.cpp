// `chunkfuse profile-layers`: QCFuse's offline critical-layer profiling (§3.4), once per
// model. Reads the span-labelled calibration sets (Natural Questions oracle passages with
// distractors, HotpotQA supporting facts), or with --data any QA dataset (answer spans; the
// prompts a deployment serves, e.g. musique_s's ~6K tokens against the default sets' ~1.4K),
// measures every layer's Recall@10% and writes the profile the qcfuse selector loads
// (<cache>/profiles/<fingerprint>.qcfuse.json by default).
#include <cstdio>
#include <filesystem>

#include "apps/app_common.h"
#include "base/clock.h"
#include "eval/datasets.h"
#include "fusion/qcfuse.h"
#include "kv/chunk_store.h"

namespace cf::apps {
namespace {

struct ProfileArgs {
  ModelOptions model;
  std::string data_dir = "../shared/datasets";
  std::string data;  // empty: NQ + HotpotQA
  size_t limit = 40;
  std::string out;
  double anchor_ratio = qcfuse::kDefaultAnchorRatio;
  int layers = qcfuse::kDefaultCriticalLayers;
  std::string target = "prophet";
  std::string probe_rows = "question";
  std::string anchors = "per_layer";
  bool anchor_sinks = true;
  std::string candidates = "auto";
};

// The last `limit` examples (a benchmark reads the first ones, so the two stay apart).
std::vector<qcfuse::CalibrationExample> calibration_examples(const ProfileArgs& a) {
  std::vector<qcfuse::CalibrationExample> examples;
  if (!a.data.empty()) {
    eval::Dataset d = eval::load_dataset(a.data, a.data_dir);
    for (size_t i = d.examples.size(); i-- > 0 && examples.size() < a.limit;) {
      eval::QaExample& e = d.examples[i];
      examples.push_back(
          qcfuse::answer_span_calibration(d.name, i, std::move(e.passages), std::move(e.question), e.answers));
    }
    if (examples.empty()) throw std::runtime_error("no examples in " + d.path);
    return examples;
  }
  const std::string nq = a.data_dir + "/nq_open_oracle.jsonl.gz";
  const std::string hotpot = a.data_dir + "/hotpotqa_dev200.jsonl";
  for (const auto& f : {nq, hotpot})
    if (!std::filesystem::exists(f))
      throw std::runtime_error("calibration file not found: " + f + " (pass --data-dir)");
  examples = qcfuse::read_nq_calibration(nq, a.limit);
  for (auto& ex : qcfuse::read_hotpot_calibration(hotpot, a.limit)) examples.push_back(std::move(ex));
  return examples;
}

int run_profile(const ProfileArgs& a) {
  std::vector<qcfuse::CalibrationExample> examples = calibration_examples(a);
  auto model = load_model(a.model);
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  ChunkStoreOptions so;  // memory only: calibration caches are not worth keeping
  so.memory_budget_bytes = size_t{2} << 30;
  so.model = StoreModel{model->fingerprint(), model->hparams()};
  ChunkStore store(so);

  std::fprintf(stderr,
               "profiling %d layers on %zu calibration examples (Recall@10%% of the %s set, anchors r_a = %.2f %s%s, "
               "probe rows: %s)\n",
               model->hparams().n_layers, examples.size(), a.target == "evidence" ? "gold evidence" : "ProphetKV top-10%",
               a.anchor_ratio, a.anchors.c_str(), a.anchor_sinks ? " with sinks" : "", a.probe_rows.c_str());

  qcfuse::ProfileOptions opt;
  opt.anchor_ratio = a.anchor_ratio;
  opt.target = a.target == "evidence" ? qcfuse::ProfileTarget::evidence : qcfuse::ProfileTarget::prophet;
  qcfuse::parse_probe_rows(a.probe_rows, opt.probe_rows);
  opt.anchor_rule.per_layer = a.anchors == "per_layer";
  opt.anchor_rule.sinks = a.anchor_sinks;
  opt.critical_layers = a.layers;
  opt.candidates = qcfuse::parse_layer_candidates(a.candidates);
  const std::vector<int> candidates = qcfuse::candidate_layers(opt.candidates, model->hparams());
  if (static_cast<int>(candidates.size()) < model->hparams().n_layers) {
    std::fprintf(stderr, "critical layers chosen among the %zu global-attention layers:", candidates.size());
    for (int l : candidates) std::fprintf(stderr, " %d", l);
    std::fprintf(stderr, " (--candidates all to rank every layer)\n");
  }
  const double t0 = now_ms();
  opt.progress = [&](size_t done, size_t total, const qcfuse::CalibrationExample& ex, size_t n) {
    const double el = (now_ms() - t0) / 1000;
    std::fprintf(stderr, "  [%zu/%zu] %s line %zu: %zu context tokens, %.0f s elapsed, ~%.0f s left\n", done, total,
                 ex.dataset.c_str(), ex.index, n, el, el / static_cast<double>(done) * static_cast<double>(total - done));
  };
  const qcfuse::LayerProfile p = qcfuse::profile_critical_layers(fwd, store, examples, opt);
  const std::string out = a.out.empty() ? qcfuse::default_profile_path(model->fingerprint_hex()) : a.out;
  qcfuse::save_profile(p, out);

  std::printf("layer  Recall@10%%\n");
  for (size_t l = 0; l < p.recall.size(); ++l) std::printf("%5zu  %.3f\n", l, p.recall[l]);
  std::printf("critical layers:");
  for (int l : p.critical_layers) std::printf(" %d (%.3f)", l, p.recall[l]);
  std::printf("\ntarget %s: set recall %.3f, all-layer recall %.3f, %.1f s; written to %s\n", p.target.c_str(),
              p.critical_set_recall, p.all_layers_recall, p.seconds, out.c_str());
  const nlohmann::json& len = p.data.at("context_tokens");
  std::printf("fitted on prompts of %zu-%zu context tokens (median %zu): it ranks layers for requests of about "
              "that length\n",
              len["min"].get<size_t>(), len["max"].get<size_t>(), len["median"].get<size_t>());
  return 0;
}

}  // namespace

void add_profile_command(CLI::App& app, CommandRunner& run) {
  auto [a, cmd] = add_model_command<ProfileArgs>(
      app, run, "profile-layers", "QCFuse: profile the critical layers of a model (offline, once)", run_profile);
  cmd->add_option("--data-dir", a->data_dir, "folder with nq_open_oracle.jsonl.gz and hotpotqa_dev200.jsonl (and --data's named datasets)")
      ->capture_default_str();
  cmd->add_option("--data", a->data,
                  "calibrate on this dataset instead (a name such as musique_s, or a file bench reads); its last "
                  "--limit examples, gold spans = the answers' occurrences (the evidence target)");
  cmd->add_option("--limit", a->limit, "calibration examples per dataset")->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_option("--out", a->out, "profile file (default: <cache>/profiles/<model fingerprint>.qcfuse.json)");
  cmd->add_option("--anchor-ratio", a->anchor_ratio, "anchor ratio r_a")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  cmd->add_option("--layers", a->layers, "critical layers to keep")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--target", a->target,
                  "what a layer's top-10% set is judged against: prophet (the full-view selector's top-10% set, no "
                  "labels) or evidence (gold answer/supporting-fact tokens)")
      ->check(CLI::IsMember({"prophet", "evidence"}))
      ->capture_default_str();
  cmd->add_option("--probe-rows", a->probe_rows, "probe query rows: question (question tokens only) or suffix (all of U)")
      ->check(CLI::IsMember({"question", "suffix"}))
      ->capture_default_str();
  cmd->add_option("--anchors", a->anchors, "anchor sets: per_layer or shared (one set, summed over layers)")
      ->check(CLI::IsMember({"per_layer", "shared"}))
      ->capture_default_str();
  cmd->add_option("--candidates", a->candidates,
                  "layers that may become critical: auto (global-attention layers only on a model with "
                  "sliding-window ones, else all), all, or global")
      ->check(CLI::IsMember({"auto", "all", "global"}))
      ->capture_default_str();
  cmd->add_option("--anchor-sinks", a->anchor_sinks, "system-prefix sink keys in the KVzip softmax (true/false)")
      ->capture_default_str();
}

}  // namespace cf::apps

#include "apps/app_common.h"

#include <cmath>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "base/clock.h"
#include "base/paths.h"
#include "model/kernels.h"

namespace cf::apps {

void add_model_options(CLI::App& cmd, ModelOptions& opt) {
  opt.model_path = default_model_path();
  cmd.add_option("-m,--model", opt.model_path, "GGUF model file")->capture_default_str();
  cmd.add_option("-t,--threads", opt.threads, "worker threads (0: one per hardware thread)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
}

void add_prompt_options(CLI::App& cmd, RagPromptOptions& opt) {
  cmd.add_option("--system", opt.system, "system message of the RAG prompt (empty: the template's own)")
      ->capture_default_str();
  cmd.add_option("--question-cue", opt.question_cue, "text after the question, the last words before the answer")
      ->capture_default_str();
}

std::unique_ptr<Model> load_model(const ModelOptions& opt, bool quiet) {
  if (!std::filesystem::exists(opt.model_path))
    throw std::runtime_error("model file not found: " + opt.model_path +
                             " (run scripts/setup.sh to fetch the default model, or pass -m)");
  const double t0 = now_ms();
  auto model = Model::load(opt.model_path);
  if (!quiet) {
    const auto& h = model->hparams();
    std::fprintf(stderr, "loaded %s: %s, %d layers, d=%d, vocab %d, kernels %s (%.0f ms)\n", opt.model_path.c_str(),
                 h.arch.c_str(), h.n_layers, h.d_model, h.vocab_size, isa_name(active_isa()), now_ms() - t0);
  }
  return model;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::optional<double> parse_number(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

namespace {
// Each item of a comma list as a number `ok` accepts, else "<option>: '<item>' is not <what>".
std::vector<double> parse_number_list(const std::string& s, const std::string& option, bool (*ok)(double),
                                      const char* what) {
  std::vector<double> out;
  for (const auto& item : split_list(s)) {
    const std::optional<double> v = parse_number(item);
    if (!v || !ok(*v)) throw std::runtime_error(option + ": '" + item + "' is not " + what);
    out.push_back(*v);
  }
  return out;
}
}  // namespace

std::vector<double> parse_ratio_list(const std::string& s, const std::string& option) {
  return parse_number_list(s, option, [](double r) { return r >= 0.0 && r <= 1.0; }, "a number in [0, 1]");
}

std::vector<double> parse_ms_list(const std::string& s, const std::string& option) {
  return parse_number_list(s, option, [](double v) { return v > 0.0; }, "a number of milliseconds > 0");
}

std::vector<ChunkContext> parse_chunk_context_list(const std::string& s, const std::string& option) {
  std::vector<ChunkContext> out;
  for (const auto& name : split_list(s)) {
    ChunkContext v;
    if (!parse_chunk_context(name, v)) throw std::runtime_error(option + ": '" + name + "' is not alone or prefixed");
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  if (out.empty()) throw std::runtime_error(option + ": give alone, prefixed or both");
  return out;
}

}  // namespace cf::apps

#include "apps/app_common.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

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

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace cf::apps

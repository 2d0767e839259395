// Options and helpers shared by the subcommands that run a model.
#pragma once
#include <memory>
#include <string>

#include "apps/commands.h"
#include "base/thread_pool.h"
#include "model/model.h"

namespace cf::apps {

struct ModelOptions {
  std::string model_path;
  int threads = 0;  // 0: all hardware threads
};

// Adds -m/--model (defaulting to the setup script's model) and -t/--threads.
void add_model_options(CLI::App& cmd, ModelOptions& opt);

// Loads the model, printing what it loaded to stderr; throws with a clear message.
std::unique_ptr<Model> load_model(const ModelOptions& opt, bool quiet = false);

double now_ms();

}  // namespace cf::apps

// Options and helpers shared by the subcommands that run a model.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "base/thread_pool.h"
#include "fusion/rag_prompt.h"
#include "kv/chunk_key.h"
#include "model/model.h"

namespace cf::apps {

struct ModelOptions {
  std::string model_path;
  int threads = 0;  // 0: all hardware threads
};

// Adds -m/--model (defaulting to the setup script's model) and -t/--threads.
void add_model_options(CLI::App& cmd, ModelOptions& opt);

// A subcommand that runs a model: its options live in a shared Args (with a ModelOptions
// `model`, given -m/-t here); the caller adds the rest to `cmd`.
template <class Args>
struct ModelCommand {
  std::shared_ptr<Args> args;
  CLI::App* cmd;
};

// Adds subcommand `name` of `parent` with the model options.
template <class Args>
ModelCommand<Args> add_model_subcommand(CLI::App& parent, const std::string& name, const std::string& description) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = parent.add_subcommand(name, description);
  add_model_options(*cmd, args->model);
  return {args, cmd};
}

// The same, and when the subcommand is chosen, `run` becomes body(args) (body: int(const Args&)).
template <class Args, class Body>
ModelCommand<Args> add_model_command(CLI::App& parent, CommandRunner& run, const std::string& name,
                                     const std::string& description, Body body) {
  ModelCommand<Args> c = add_model_subcommand<Args>(parent, name, description);
  c.cmd->callback([&run, args = c.args, body] { run = [args, body] { return body(*args); }; });
  return c;
}

// Adds --system and --question-cue: the RAG layout's words (fusion/rag_prompt.h), for trying
// another layout; the defaults are the measured one (docs/benchmarks-history.md, "The RAG prompt").
void add_prompt_options(CLI::App& cmd, RagPromptOptions& opt);

// Loads the model, printing what it loaded to stderr; throws with a clear message.
std::unique_ptr<Model> load_model(const ModelOptions& opt, bool quiet = false);

// "a,b,,c" -> {a, b, c}.
std::vector<std::string> split_list(const std::string& s);
// The whole of `text` as a finite number (std::stod, nothing left over), else nullopt.
std::optional<double> parse_number(const std::string& text);
// Comma-separated ratios in [0, 1]; `option` names the flag in the error.
std::vector<double> parse_ratio_list(const std::string& s, const std::string& option = "--ratios");
// "500,1200" -> {500, 1200}; each a finite number > 0 (milliseconds), else a runtime_error naming `option`.
std::vector<double> parse_ms_list(const std::string& s, const std::string& option);
// Comma-separated chunk contexts (alone, prefixed), duplicates dropped, at least one.
std::vector<ChunkContext> parse_chunk_context_list(const std::string& s, const std::string& option);

}  // namespace cf::apps

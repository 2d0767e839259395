// `chunkfuse generate`: plain text generation (full prefill, then decoding), streamed to
// standard output; timings go to standard error.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "apps/app_common.h"
#include "runtime/generate.h"

namespace cf::apps {
namespace {

struct GenerateArgs {
  ModelOptions model;
  std::string prompt, prompt_file, system;
  bool chat = false;
  int n_predict = 128;
  SamplingParams sampling{0.8f, 40, 0.95f, 0.05f, 1.0f, 64, 0};
  std::vector<std::string> stop;
  bool timings = true;
};

int run_generate(const GenerateArgs& a) {
  std::string prompt = a.prompt;
  if (!a.prompt_file.empty()) {
    std::ifstream in(a.prompt_file);
    if (!in) throw std::runtime_error("cannot read prompt file " + a.prompt_file);
    std::stringstream ss;
    ss << in.rdbuf();
    prompt = ss.str();
  }
  if (prompt.empty()) throw std::runtime_error("empty prompt (give -p TEXT or -f FILE)");
  a.sampling.validate();
  auto model = load_model(a.model);
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  Generator gen(fwd);

  std::vector<TokenId> ids;
  if (a.chat) {
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", prompt});
    ids = model->tokenizer().encode(model->chat_template().apply(msgs, true), true, true);
  } else {
    ids = model->tokenizer().encode(prompt, true, false);
  }
  const int ctx = model->hparams().context_length;
  if (static_cast<int>(ids.size()) + a.n_predict > ctx)
    throw std::runtime_error("prompt of " + std::to_string(ids.size()) + " tokens plus " + std::to_string(a.n_predict) +
                             " to generate exceeds the model's context of " + std::to_string(ctx));
  KvCache cache(model->hparams(), ids.size() + a.n_predict);
  GenerateOptions opt;
  opt.max_tokens = a.n_predict;
  opt.sampling = a.sampling;
  opt.stop = a.stop;
  opt.on_text = [](std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  GenerateResult r = gen.generate(cache, ids, opt);
  std::fputc('\n', stdout);
  if (a.timings)
    std::fprintf(stderr, "prompt %zu tokens, prefill %.1f ms (%.1f tok/s), ttft %.1f ms; generated %zu tokens, %.1f tok/s; stop: %s\n",
                 r.prompt_tokens, r.prefill_ms, r.prompt_tokens * 1000.0 / std::max(r.prefill_ms, 1e-9), r.ttft_ms,
                 r.tokens.size(), r.decode_tokens_per_s(), r.stop_reason.c_str());
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, CommandRunner& run) {
  auto [a, cmd] = add_model_command<GenerateArgs>(
      app, run, "generate", "generate text from a prompt (full prefill, then decoding)", run_generate);
  auto* p = cmd->add_option("-p,--prompt", a->prompt, "prompt text");
  cmd->add_option("-f,--file", a->prompt_file, "read the prompt from a file")->excludes(p)->check(CLI::ExistingFile);
  cmd->add_flag("--chat", a->chat, "wrap the prompt as a user message in the model's chat template");
  cmd->add_option("--system", a->system, "system message (with --chat)");
  cmd->add_option("-n,--n-predict", a->n_predict, "tokens to generate")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--temp", a->sampling.temperature, "temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", a->sampling.top_k, "top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", a->sampling.top_p, "top-p (1: off)")->capture_default_str();
  cmd->add_option("--min-p", a->sampling.min_p, "min-p (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", a->sampling.repeat_penalty, "repetition penalty (1: off)")->capture_default_str();
  cmd->add_option("--repeat-last-n", a->sampling.repeat_last_n, "tokens the penalty looks back")->capture_default_str();
  cmd->add_option("--seed", a->sampling.seed, "random seed")->capture_default_str();
  cmd->add_option("--stop", a->stop, "stop string (repeatable)");
  cmd->add_flag("!--no-timings", a->timings, "do not print timings to standard error");
}

}  // namespace cf::apps

// `chunkfuse ask`: answer a question over passages (one chunk per passage), print the
// answer and the time to first token.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "apps/app_common.h"
#include "fusion/rag_prompt.h"
#include "runtime/generate.h"

namespace cf::apps {
namespace {

struct AskArgs {
  ModelOptions model;
  std::string passages_file;
  std::string question;
  std::string method = "full";
  double ratio = 0.15;
  int max_tokens = 64;
  bool json = false;
};

int run_ask(const AskArgs& a) {
  if (a.method != "full")
    throw std::runtime_error("method '" + a.method + "' is not available yet (available: full)");
  if (a.question.empty()) throw std::runtime_error("empty --question");
  const auto passages = read_passages_jsonl(a.passages_file);
  auto model = load_model(a.model, a.json);
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  Generator gen(fwd);

  const double t_request = now_ms();
  RagRequest req = build_rag_request(*model, passages, a.question);
  const auto prompt = req.flatten();
  const int ctx = model->hparams().context_length;
  if (static_cast<int>(prompt.size()) + a.max_tokens > ctx)
    throw std::runtime_error("prompt of " + std::to_string(prompt.size()) + " tokens plus " +
                             std::to_string(a.max_tokens) + " to generate exceeds the context of " + std::to_string(ctx));
  KvCache cache(model->hparams(), prompt.size() + a.max_tokens);
  GenerateOptions opt;
  opt.max_tokens = a.max_tokens;
  opt.sampling.temperature = 0;
  GenerateResult r = gen.generate(cache, prompt, opt);
  const double total = now_ms() - t_request;

  if (a.json) {
    nlohmann::json j{{"answer", r.text},
                     {"method", a.method},
                     {"ttft_ms", r.ttft_ms},
                     {"phases_ms", {{"prefill", r.prefill_ms}, {"first_token", r.ttft_ms - r.prefill_ms}}},
                     {"prompt_tokens", prompt.size()},
                     {"context_tokens", req.context_tokens()},
                     {"recomputed_tokens", req.context_tokens()},
                     {"generated_tokens", r.tokens.size()},
                     {"decode_tokens_per_s", r.decode_tokens_per_s()},
                     {"total_ms", total}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s\n", r.text.c_str());
    std::fprintf(stderr, "method %s: %zu prompt tokens (%zu in %zu passages), TTFT %.1f ms, %zu tokens at %.1f tok/s\n",
                 a.method.c_str(), prompt.size(), req.context_tokens(), req.chunks.size(), r.ttft_ms, r.tokens.size(),
                 r.decode_tokens_per_s());
  }
  return 0;
}

}  // namespace

void add_ask_command(CLI::App& app, CommandRunner& run) {
  auto a = std::make_shared<AskArgs>();
  CLI::App* cmd = app.add_subcommand("ask", "answer a question over passages (JSON Lines, one chunk per passage)");
  add_model_options(*cmd, a->model);
  cmd->add_option("--passages", a->passages_file, "JSON Lines file, one {\"title\":..., \"text\":...} per line")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-q,--question", a->question, "the question")->required();
  cmd->add_option("--method", a->method, "fusion method")->capture_default_str();
  cmd->add_option("--ratio", a->ratio, "share of context tokens to recompute")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  cmd->add_option("-n,--max-tokens", a->max_tokens, "answer length limit")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([&run, a] { run = [a] { return run_ask(*a); }; });
}

}  // namespace cf::apps

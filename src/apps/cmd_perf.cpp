// `chunkfuse perf`: prefill and decode speed on given token ids (bench/runtime_bench.py
// drives it side by side with llama.cpp).
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "apps/app_common.h"
#include "base/clock.h"
#include "runtime/forward.h"
#include "runtime/sampler.h"

namespace cf::apps {
namespace {

struct PerfArgs {
  ModelOptions model;
  std::string tokens_file;
  std::vector<int> prompt_tokens{512, 2048};
  int gen_tokens = 64;
  int decode_context = 512;
  int reps = 1;
  bool json = false;
};

std::vector<TokenId> read_ids(const std::string& path, const Model& m, size_t need) {
  std::vector<TokenId> ids;
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    nlohmann::json j;
    try {
      in >> j;
      ids = j.get<std::vector<TokenId>>();
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(path + ": expected a JSON list of token ids (" + e.what() + ")");
    }
  } else {
    // A deterministic prose-like prompt when no ids are given.
    std::string text;
    while (ids.size() < need) {
      text += "The quick brown fox jumps over the lazy dog while the river keeps flowing to the sea. ";
      ids = m.tokenizer().encode(text, false, false);
    }
  }
  if (ids.size() < need)
    throw std::runtime_error("need " + std::to_string(need) + " token ids, the file has " + std::to_string(ids.size()));
  for (TokenId t : ids)
    if (t < 0 || t >= m.hparams().vocab_size) throw std::runtime_error("token id out of range: " + std::to_string(t));
  return ids;
}

int run_perf(const PerfArgs& a) {
  auto model = load_model(a.model, a.json);
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  int need = a.decode_context;
  for (int n : a.prompt_tokens) {
    if (n < 1) throw std::runtime_error("--prompt-tokens values must be >= 1");
    need = std::max(need, n);
  }
  const auto ids = read_ids(a.tokens_file, *model, need);

  nlohmann::json out;
  out["threads"] = pool.size();
  out["isa"] = isa_name(active_isa());
  out["prefill"] = nlohmann::json::array();
  auto prefill = [&](KvCache& cache, int n) {
    std::vector<int32_t> pos(n);
    for (int i = 0; i < n; ++i) pos[i] = i;
    const size_t last = n - 1;
    ForwardInput in{std::span<const TokenId>(ids.data(), n), pos, {}, std::span<const size_t>(&last, 1)};
    return fwd.run(cache, in);
  };
  for (int n : a.prompt_tokens) {
    for (int rep = 0; rep < a.reps; ++rep) {
      KvCache cache(model->hparams(), n);
      const double t0 = now_ms();
      prefill(cache, n);
      const double s = (now_ms() - t0) / 1000.0;
      out["prefill"].push_back({{"n_tokens", n}, {"seconds", s}, {"tok_per_s", n / s}});
      if (!a.json) std::fprintf(stderr, "prefill %5d tokens: %8.1f ms  %7.1f tok/s\n", n, s * 1000, n / s);
    }
  }
  for (int rep = 0; rep < a.reps && a.gen_tokens > 0; ++rep) {
    KvCache cache(model->hparams(), a.decode_context + a.gen_tokens);
    auto fo = prefill(cache, a.decode_context);
    TokenId t = argmax(fo.logits.data(), fo.vocab);
    const double t0 = now_ms();
    for (int i = 0; i < a.gen_tokens; ++i) {
      const int32_t p = a.decode_context + i;
      const size_t row = 0;
      ForwardInput in{std::span<const TokenId>(&t, 1), std::span<const int32_t>(&p, 1), {},
                      std::span<const size_t>(&row, 1), WeightMatrix::KQuantOrder::PerRow};
      auto o = fwd.run(cache, in);
      t = argmax(o.logits.data(), o.vocab);
    }
    const double s = (now_ms() - t0) / 1000.0;
    out["decode"] = {{"n_tokens", a.gen_tokens}, {"context", a.decode_context}, {"seconds", s},
                     {"tok_per_s", a.gen_tokens / s}};
    if (!a.json) std::fprintf(stderr, "decode  %5d tokens: %8.1f ms  %7.1f tok/s\n", a.gen_tokens, s * 1000, a.gen_tokens / s);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  out["rss_peak_bytes"] = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  if (a.json) std::printf("%s\n", out.dump().c_str());
  else std::fprintf(stderr, "peak resident memory: %.1f MiB\n", ru.ru_maxrss / 1024.0);
  return 0;
}

}  // namespace

void add_perf_command(CLI::App& app, CommandRunner& run) {
  auto a = std::make_shared<PerfArgs>();
  CLI::App* cmd = app.add_subcommand("perf", "measure prefill and decode speed");
  add_model_options(*cmd, a->model);
  cmd->add_option("--tokens-file", a->tokens_file, "JSON list of token ids to use as the prompt (default: built-in text)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "prefill lengths to time")->delimiter(',')->capture_default_str();
  cmd->add_option("--gen-tokens", a->gen_tokens, "tokens to decode (0: skip decode)")->check(CLI::Range(0, 100000))->capture_default_str();
  cmd->add_option("--decode-context", a->decode_context, "prompt tokens before decoding")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--reps", a->reps, "repetitions")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object to standard output");
  cmd->callback([&run, a] { run = [a] { return run_perf(*a); }; });
}

}  // namespace cf::apps

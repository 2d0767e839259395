// `chunkfuse ask`: answer a question over passages (one chunk per passage) with a fusion
// method; prints the answer, the per-phase timings and which tokens were recomputed.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "apps/app_common.h"
#include "base/paths.h"
#include "fusion/auto_quality.h"
#include "fusion/executor.h"
#include "fusion/methods.h"
#include "runtime/generate.h"

namespace cf::apps {
namespace {

struct AskArgs {
  ModelOptions model;
  std::string passages_file;
  std::string question;
  std::string method = default_fusion_method_name();
  double ratio = 0.15;
  double quality = 0;  // --method auto: the target (fusion/auto_quality.h)
  int max_tokens = 64;
  std::string store_dir;
  bool json = false;
  bool show_tokens = true;
  uint64_t seed = 0;
  std::string chunk_context = "alone";
  RagPromptOptions prompt;
};

// The context with recomputed tokens highlighted (reverse video on a terminal, [[...]]
// otherwise), one passage per paragraph.
std::string highlighted_context(const Tokenizer& tok, const RagRequest& req, const std::vector<size_t>& recomputed,
                                bool color) {
  const std::set<size_t> chosen(recomputed.begin(), recomputed.end());
  std::string out;
  size_t slot = req.system.size();
  for (const auto& chunk : req.chunks) {
    bool in = false;
    for (TokenId t : chunk) {
      const bool hit = chosen.count(slot++) > 0;
      if (hit != in) out += hit ? (color ? "\x1b[7m" : "[[") : (color ? "\x1b[0m" : "]]");
      in = hit;
      out += tok.token_to_piece(t, false);
    }
    if (in) out += color ? "\x1b[0m" : "]]";
  }
  return out;
}

int run_ask(const AskArgs& a) {
  if (a.question.empty()) throw std::runtime_error("empty --question");
  const MethodEntry& method = method_entry(a.method);  // unknown names fail before any work
  if (method.kind == MethodKind::automatic && !(a.quality > 0 && a.quality <= 1))
    throw std::runtime_error("--method auto needs --quality in (0, 1]: the share of answers identical to full prefill's");
  const auto passages = read_passages_jsonl(a.passages_file);
  auto model = load_model(a.model, a.json);
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  ChunkStoreOptions so;
  so.dir = a.store_dir.empty() ? cache_root() + "/store" : a.store_dir;
  so.model = StoreModel{model->fingerprint(), model->hparams()};
  ChunkStore store(so);
  FusionExecutor executor(fwd, store);

  RagRequest req = build_rag_request(*model, passages, a.question, a.prompt);
  if (static_cast<int>(req.flatten().size()) + a.max_tokens > model->hparams().context_length)
    throw std::runtime_error("prompt of " + std::to_string(req.flatten().size()) + " tokens plus " +
                             std::to_string(a.max_tokens) + " to generate exceeds the context of " +
                             std::to_string(model->hparams().context_length));
  FusionOptions fo{a.method, a.ratio, a.seed};
  fo.quality = a.quality;
  parse_chunk_context(a.chunk_context, fo.chunk_context);  // CLI11 checked the name
  FusionResult fr = executor.prefill(req, fo);
  Generator gen(fwd);
  GenerateOptions opt;
  opt.max_tokens = a.max_tokens;
  opt.sampling.temperature = 0;
  const std::vector<TokenId> prompt = req.flatten();
  GenerateResult g = gen.continue_from(fr.cache, fr.logits, fr.next_position, prompt, opt);
  const auto& t = fr.timings;
  const double ttft = t.ttft_ms + g.ttft_ms;  // + choosing the first token

  if (a.json) {
    nlohmann::json j{{"answer", g.text},
                     {"method", a.method},
                     {"ratio", a.ratio},
                     {"ttft_ms", ttft},
                     {"phases_ms",
                      {{"lookup", t.lookup_ms},
                       {"load", t.load_ms},
                       {"selection", t.selection_ms},
                       {"recompute", t.recompute_ms},
                       {"first_token", g.ttft_ms}}},
                     {"offline_ms", t.offline_ms},
                     {"prompt_tokens", prompt.size()},
                     {"context_tokens", fr.context_tokens},
                     {"recomputed_tokens", fr.recomputed.size()},
                     {"recomputed_positions", fr.recomputed},
                     {"chunk_hits", fr.chunk_hits},
                     {"chunk_misses", fr.chunk_misses},
                     {"generated_tokens", g.tokens.size()},
                     {"decode_tokens_per_s", g.decode_tokens_per_s()},
                     {"selection", fr.selection_details}};
    if (!fr.auto_decision.is_null()) j["auto"] = fr.auto_decision;
    // The answer may end inside a UTF-8 character (cut by the token limit): U+FFFD, not a throw.
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%s\n", g.text.c_str());
  // What ran: the method asked for, or the one the auto policy chose.
  const bool chose = fr.auto_decision.is_object();
  const std::string ran_method = chose ? fr.auto_decision["method"].get<std::string>() : a.method;
  const double ran_ratio = chose ? fr.auto_decision["ratio"].get<double>() : a.ratio;
  if (const auto& d = fr.auto_decision; d.is_object()) {
    // Every step run, with its prediction against the plan's threshold, then what answered.
    std::string steps;
    for (const auto& t : d["trace"]) {
      char one[96];
      if (is_full_prefill(t["method"].get<std::string>())) std::snprintf(one, sizeof one, "full prefill");
      else std::snprintf(one, sizeof one, "%s %.2f (p %.3f)", t["method"].get<std::string>().c_str(),
                         t["ratio"].get<double>(), t["predicted"].get<double>());
      steps += (steps.empty() ? "" : " -> ") + std::string(one);
    }
    std::fprintf(stderr, "auto (quality %.2f, accepting from p >= %.3f): %s; answered by %s at ratio %.2f, decision %.0f ms%s\n",
                 a.quality, d["threshold"].get<double>(), steps.c_str(), d["method"].get<std::string>().c_str(),
                 d["ratio"].get<double>(), d["decision_ms"].get<double>(),
                 d["calibrated"].get<bool>() ? "" : " (no calibration for this model: full prefill; run `chunkfuse calibrate`)");
  }
  // Which QCFuse profile ran: a fresh install must not fall back to floor(L/2) unnoticed.
  if (const auto& d = fr.selection_details; d.is_object() && d.contains("layers_source"))
    std::fprintf(stderr, "qcfuse critical layers %s from %s\n", d["critical_layers"].dump().c_str(),
                 d["layers_source"].get<std::string>().c_str());
  if (const auto& d = fr.selection_details; d.is_object() && d.contains("profile_note"))
    std::fprintf(stderr, "note: %s\n", d["profile_note"].get<std::string>().c_str());
  if (a.show_tokens && !is_full_prefill(ran_method)) {
    const bool color = isatty(fileno(stderr));
    std::fprintf(stderr, "\nrecomputed tokens (%zu of %zu context tokens)%s:\n%s\n\n", fr.recomputed.size(),
                 fr.context_tokens, color ? ", highlighted" : ", in [[ ]]",
                 highlighted_context(model->tokenizer(), req, fr.recomputed, color).c_str());
  }
  std::fprintf(stderr,
               "method %s ratio %.2f: %zu prompt tokens (%zu context in %zu passages, %zu recomputed); TTFT %.1f ms "
               "= lookup %.1f + load %.1f + selection %.1f + recompute %.1f + first token %.1f; chunks %zu cached, "
               "%zu computed now (%.0f ms offline); %zu tokens at %.1f tok/s\n",
               ran_method.c_str(), ran_ratio, prompt.size(), fr.context_tokens, req.chunks.size(), fr.recomputed.size(), ttft,
               t.lookup_ms, t.load_ms, t.selection_ms, t.recompute_ms, g.ttft_ms, fr.chunk_hits, fr.chunk_misses,
               t.offline_ms, g.tokens.size(), g.decode_tokens_per_s());
  return 0;
}

}  // namespace

void add_ask_command(CLI::App& app, CommandRunner& run) {
  auto [a, cmd] = add_model_command<AskArgs>(
      app, run, "ask", "answer a question over passages (JSON Lines, one chunk per passage)", run_ask);
  cmd->add_option("--passages", a->passages_file, "JSON Lines file, one {\"title\":..., \"text\":...} per line")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-q,--question", a->question, "the question")->required();
  cmd->add_option("--method", a->method, "fusion method: " + known_methods_text())->capture_default_str();
  cmd->add_option("--ratio", a->ratio, "share of context tokens to recompute")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  cmd->add_option("--quality", a->quality,
                  "with --method auto: the probability, in (0, 1], of an answer identical to full prefill's; the "
                  "policy picks method and ratio");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "answer length limit")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--store", a->store_dir, "chunk-cache store directory (default: <cache>/store)");
  cmd->add_option("--seed", a->seed, "seed of methods that sample")->capture_default_str();
  cmd->add_option("--chunk-context,--chunk-variant", a->chunk_context, "chunk caches: alone (from position 0) or prefixed (after S)")
      ->check(CLI::IsMember({"alone", "prefixed"}))
      ->capture_default_str();
  add_prompt_options(*cmd, a->prompt);
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->add_flag("!--no-tokens", a->show_tokens, "do not print the recomputed tokens");
}

}  // namespace cf::apps

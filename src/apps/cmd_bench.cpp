// `chunkfuse bench`: quality and speed of fusion methods on a QA dataset (issue 4). Runs
// every example through full prefill and each method x ratio, appends one JSON line per
// run to <out>/results.jsonl (a killed run resumes where it stopped), then writes the
// report, CSV and plots with tools/bench_report.py. With --peer it first times llama.cpp's
// full prefill of the same prompt ids (bench/llamacpp_peer.py), so the report can give every
// speed as a ratio to llama.cpp too.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "apps/app_common.h"
#include "base/paths.h"
#include "eval/runner.h"
#include "fusion/methods.h"

namespace cf::apps {
namespace {

struct BenchArgs {
  ModelOptions model;
  std::string data;
  std::string data_dir;
  std::string methods = "full,reuse,epic,cacheblend";
  std::string ratios = "0,0.05,0.15,0.3,1";
  std::string qualities;
  std::string ttft_budgets;  // ms
  size_t limit = 0;
  size_t from = 0;
  std::string shard;  // "K/N"
  int max_tokens = 32;
  uint64_t seed = 0;
  std::string out;
  std::string store;
  bool memory_store = false;
  std::string dtype = "f16";
  size_t memory_mb = 512;
  bool no_report = false;
  size_t chunk_tokens = 0;
  bool peer = false;
  std::string peer_python;
  std::string method_options;
  std::string method_presets;
  std::string ablation;
  std::string jaccard_ref;
  size_t chunks = 0;
  std::string chunk_contexts = "alone";
  std::string reference_cache;  // empty: <cache>/bench_references
  bool no_reference_cache = false;
  RagPromptOptions prompt;
};

// "K/N" -> (K, N) with 0 <= K < N.
bool parse_shard(const std::string& s, size_t& index, size_t& count) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return false;
  try {
    size_t used_k = 0, used_n = 0;
    const unsigned long k = std::stoul(s.substr(0, slash), &used_k), n = std::stoul(s.substr(slash + 1), &used_n);
    if (used_k != slash || used_n != s.size() - slash - 1 || s[0] == '-' || s[slash + 1] == '-' || k >= n) return false;
    index = k;
    count = n;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// One word for a POSIX shell whatever it holds: '...' with each ' written as '\''.
std::string shell_word(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// Appends the invocation to <out>/bench_command.txt, for the report ("the command and machine"),
// as a command a shell can run again.
void record_command(const BenchArgs& a) {
  std::ostringstream c;
  c << "chunkfuse bench -m " << a.model.model_path << " --data " << a.data;
  if (!a.data_dir.empty()) c << " --data-dir " << a.data_dir;
  c << " --methods " << a.methods << " --ratios " << a.ratios;
  if (!a.qualities.empty()) c << " --qualities " << a.qualities;
  if (!a.ttft_budgets.empty()) c << " --ttft-budgets " << a.ttft_budgets;
  if (a.from) c << " --from " << a.from;
  if (a.limit) c << " --limit " << a.limit;
  if (!a.shard.empty()) c << " --shard " << a.shard;
  if (a.chunk_tokens) c << " --chunk-tokens " << a.chunk_tokens;
  if (!a.method_options.empty()) c << " --method-options " << shell_word(a.method_options);
  if (!a.method_presets.empty()) c << " --method-presets " << shell_word(a.method_presets);
  if (!a.ablation.empty()) c << " --ablation " << a.ablation;
  if (!a.jaccard_ref.empty()) c << " --jaccard-ref " << a.jaccard_ref;
  if (a.chunks) c << " --chunks " << a.chunks;
  if (a.chunk_contexts != "alone") c << " --chunk-contexts " << a.chunk_contexts;
  const RagPromptOptions default_prompt;
  if (a.prompt.system != default_prompt.system) c << " --system " << shell_word(a.prompt.system);
  if (a.prompt.question_cue != default_prompt.question_cue) c << " --question-cue " << shell_word(a.prompt.question_cue);
  if (a.peer) c << " --peer";
  if (!a.peer_python.empty()) c << " --peer-python " << a.peer_python;
  c << " --max-tokens " << a.max_tokens << " --seed " << a.seed << " -t " << a.model.threads;
  if (a.memory_store) c << " --memory-store";
  if (!a.store.empty()) c << " --store " << a.store;
  c << " --dtype " << a.dtype << " --memory-mb " << a.memory_mb << " --out " << a.out;
  std::filesystem::create_directories(a.out);
  std::ofstream(std::filesystem::path(a.out) / "bench_command.txt", std::ios::app) << c.str() << "\n";
}

int run_bench(const BenchArgs& a) {
  eval::BenchConfig cfg;
  cfg.methods = split_list(a.methods);
  cfg.ratios = parse_ratio_list(a.ratios);
  cfg.qualities = parse_ratio_list(a.qualities, "--qualities");
  cfg.ttft_budgets = parse_ms_list(a.ttft_budgets, "--ttft-budgets");
  if (!a.method_presets.empty()) {
    std::string text = a.method_presets;
    if (std::filesystem::exists(text)) {  // a file, else inline JSON
      std::ifstream in(text);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    try {
      cfg.method_presets = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(std::string("--method-presets: not JSON (nor a file): ") + e.what());
    }
  }
  if (!a.ablation.empty()) {  // the issue-16 ablation: its presets join the plan after --methods
    if (a.ablation != "qcfuse") throw std::runtime_error("--ablation: unknown ablation '" + a.ablation + "' (known: qcfuse)");
    if (!cfg.method_presets.is_object()) cfg.method_presets = nlohmann::json::object();
    const nlohmann::json ablation = eval::qcfuse_ablation_presets();
    for (auto it = ablation.begin(); it != ablation.end(); ++it) {
      cfg.method_presets[it.key()] = it.value();
      cfg.methods.push_back(it.key());
    }
    for (const char* m : {"prophet", "qcfuse"})
      if (std::find(cfg.methods.begin(), cfg.methods.end(), m) == cfg.methods.end()) cfg.methods.insert(cfg.methods.begin(), m);
  }
  cfg.jaccard_reference = !a.jaccard_ref.empty() ? a.jaccard_ref : (!a.ablation.empty() ? "prophet" : "");
  if (cfg.jaccard_reference == "none") cfg.jaccard_reference.clear();
  cfg.chunks_per_request = a.chunks;
  try {
    eval::check_method_presets(cfg.method_presets);
    eval::expand_runs(cfg.methods, cfg.ratios, cfg.method_presets, cfg.qualities, cfg.ttft_budgets);  // reject bad methods before loading anything
    if (!cfg.jaccard_reference.empty()) eval::expand_runs({cfg.jaccard_reference}, {0.5}, cfg.method_presets);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  if (!parse_dtype(a.dtype, cfg.disk_dtype)) throw std::runtime_error("unknown --dtype " + a.dtype);
  cfg.limit = a.limit;
  cfg.first_example = a.from;
  if (a.limit && a.from >= a.limit)  // before the model loads; past the dataset's end the runner says so
    throw std::runtime_error("--from " + std::to_string(a.from) + ": not below --limit " + std::to_string(a.limit));
  if (!a.shard.empty() && !parse_shard(a.shard, cfg.shard_index, cfg.shard_count))
    throw std::runtime_error("--shard: '" + a.shard + "' is not K/N with 0 <= K < N (e.g. 0/4)");
  cfg.max_tokens = a.max_tokens;
  cfg.seed = a.seed;
  cfg.out_dir = a.out;
  cfg.store_dir = a.store;
  cfg.memory_only_store = a.memory_store;
  cfg.memory_budget_bytes = a.memory_mb << 20;
  cfg.model_name = std::filesystem::path(a.model.model_path).filename().string();
  cfg.chunk_tokens = a.chunk_tokens;
  cfg.prompt = a.prompt;
  cfg.chunk_contexts = parse_chunk_context_list(a.chunk_contexts, "--chunk-contexts");
  if (!a.no_reference_cache)
    cfg.reference_cache_dir =
        a.reference_cache.empty() ? (std::filesystem::path(cache_root()) / "bench_references").string() : a.reference_cache;
  if (!a.method_options.empty()) {
    try {
      cfg.method_options = nlohmann::json::parse(a.method_options);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(std::string("--method-options: not JSON: ") + e.what());
    }
    if (!cfg.method_options.is_object())
      throw std::runtime_error("--method-options: expected an object {\"method\": {options}}");
    // Judged now, by each selector's own configure(), so a typo fails before any model work.
    for (const auto& [method, options] : cfg.method_options.items()) {
      try {
        make_selector(method)->configure(options);
      } catch (const std::invalid_argument& e) {
        throw std::runtime_error(std::string("--method-options: ") + e.what());
      }
    }
  }

  auto model = load_model(a.model);  // first: RULER tasks are generated with its tokenizer
  const eval::Dataset dataset = eval::load_dataset(a.data, a.data_dir, a.seed, &model->tokenizer());
  ThreadPool pool(a.model.threads);
  cfg.threads = static_cast<int>(pool.size());
  Forward fwd(*model, pool);
  std::fprintf(stderr, "bench: %s (%zu examples, %s), methods %s, ratios %s, %d threads -> %s\n",
               dataset.name.c_str(), dataset.examples.size(), dataset.path.c_str(), a.methods.c_str(),
               a.ratios.c_str(), cfg.threads, a.out.c_str());

  record_command(a);
  eval::BenchRunner runner(fwd, cfg);
  const eval::BenchSummary s = runner.run(dataset);
  std::printf("%zu rows written, %zu already present, %zu/%zu examples run", s.rows_written, s.rows_already_present,
              s.examples_run, s.examples);
  if (s.examples_skipped) std::printf(", %zu skipped (too long)", s.examples_skipped);
  if (s.references_reused) std::printf(", %zu scored against cached full prefills", s.references_reused);
  std::printf(", %.1f s\nresults %s\n", s.seconds, s.results_path.c_str());
  std::string how_to;
  if (a.peer) {
    std::fflush(stdout);
    const int prc = eval::run_peer(a.out, a.model.model_path, cfg.threads, a.peer_python, how_to);
    if (prc < 0) throw std::runtime_error("--peer: " + how_to);
    if (prc != 0) throw std::runtime_error("the llama.cpp peer failed (exit " + std::to_string(prc) + "): " + how_to);
  }
  if (a.no_report) return 0;
  const int rc = eval::run_report(a.out, how_to);
  if (rc < 0) {
    std::printf("report not written: %s\n", how_to.c_str());
    return 0;
  }
  if (rc != 0) throw std::runtime_error("the report script failed (exit " + std::to_string(rc) + "): " + how_to);
  std::printf("report %s\n", (std::filesystem::path(a.out) / "report.md").c_str());
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, CommandRunner& run) {
  auto [a, cmd] = add_model_command<BenchArgs>(
      app, run, "bench", "quality and speed of fusion methods on a QA dataset (resumable)", run_bench);
  cmd->add_option("--data", a->data,
                  "dataset: musique_s, hotpotqa, nq_open_oracle (gold + 9 seeded distractors), kv_retrieval (5 "
                  "pairs a chunk), rgb_en_fact, ruler:TASK:LENGTH (generated; TASK niah_single, niah_multikey, "
                  "niah_multivalue, variable_tracking; LENGTH context tokens, e.g. ruler:niah_single:4096), or a "
                  "file (those formats, gzip or plain, or JSON Lines {question, answers, passages:[{title,text}]})")
      ->required();
  cmd->add_option("--data-dir", a->data_dir, "folder of the named datasets (default: ../shared/datasets beside the "
                                             "repository, or $CHUNKFUSE_DATA_DIR)");
  cmd->add_option("--methods", a->methods, "comma-separated methods (full, reuse, the selectors, and auto with --qualities and/or --ttft-budgets)")
      ->capture_default_str();
  cmd->add_option("--ratios", a->ratios, "comma-separated recompute ratios (full and reuse run once)")
      ->capture_default_str();
  cmd->add_option("--qualities", a->qualities,
                  "comma-separated quality targets of method auto (the share of answers identical to full "
                  "prefill's; it picks method and ratio per request): one run per target, its rows' ratio column "
                  "holds the target, the choice is in their \"auto\" field");
  cmd->add_option("--ttft-budgets", a->ttft_budgets,
                  "comma-separated first-token budgets in ms of method auto (fusion.ttft_ms alone: the best "
                  "plan this machine's cost model says fits): one run per budget, its rows' ratio column and "
                  "\"ttft_budget_ms\" hold the budget, the choice and the predicted and actual TTFT are in "
                  "their \"auto\" field");
  cmd->add_option("--limit", a->limit, "first N examples only (0: all)")->capture_default_str();
  cmd->add_option("--from", a->from,
                  "start at example N (0-based), skipping the first N: with --limit M runs examples N..M-1, to "
                  "extend a folder to more examples for some methods while others already cover them")
      ->capture_default_str();
  cmd->add_option("--shard", a->shard,
                  "K/N: only examples whose index is K modulo N (of --from..--limit), to split a long run "
                  "across processes or machines; concatenate their results.jsonl files to merge");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "answer length limit")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--seed", a->seed, "seed for sampling: methods (random), NQ distractors, RGB passage order, RULER")
      ->capture_default_str();
  cmd->add_option("--chunk-tokens", a->chunk_tokens,
                  "re-chunk: concatenate each example's passages in retrieval order, tokenize once, cut every N "
                  "tokens (0: one chunk per passage); rows are labelled <dataset>@<N>tok")
      ->capture_default_str();
  cmd->add_option("--method-options", a->method_options,
                  "JSON object of per-method options, e.g. '{\"cachecraft\": {\"create_variants\": true}}' "
                  "(default: cachecraft runs without creating variants online, since a variant made by one run of "
                  "an example would be an exact match for its runs at other ratios)");
  cmd->add_option("--method-presets,--variants", a->method_presets,
                  "named method presets (--variants: the older name), JSON (inline or a file): {\"name\": {\"method\": \"qcfuse\", \"options\": "
                  "{...}}}; list the names in --methods; rows carry the name as their method");
  cmd->add_option("--ablation", a->ablation,
                  "add a predefined ablation to the plan: qcfuse (issue 16: anchor ratio, layer view, probe rows, "
                  "anchor rule, profile target; implies --jaccard-ref prophet)");
  cmd->add_option("--jaccard-ref", a->jaccard_ref,
                  "method or method preset whose recomputed positions every selector row is compared with (jaccard_ref "
                  "column); none to turn off");
  cmd->add_option("--chunks", a->chunks,
                  "exactly N chunks per request: passages of the following examples are added as distractors "
                  "until there are enough (with --chunk-tokens 512 --chunks 20: the QCFuse paper's setting)")
      ->capture_default_str();
  cmd->add_option("--chunk-contexts,--chunk-variants", a->chunk_contexts,
                  "comma-separated chunk contexts (--chunk-variants: the older name) every method but full runs on: alone (each chunk computed "
                  "from position 0) and/or prefixed (after the system prefix S, FusionRAG eq. 5); prefixed rows "
                  "carry chunk_context and the report compares them with alone, paired")
      ->capture_default_str();
  add_prompt_options(*cmd, a->prompt);
  cmd->add_option("--out", a->out, "output folder (results.jsonl, report.md, summary.csv, plots)")->required();
  cmd->add_option("--store", a->store, "chunk-cache store folder (default: <out>/store)");
  cmd->add_flag("--memory-store", a->memory_store, "keep chunk caches in memory only (no disk tier)");
  cmd->add_option("--dtype", a->dtype, "disk dtype of the chunk caches: f16, bf16, f32")->capture_default_str();
  cmd->add_option("--memory-mb", a->memory_mb, "memory tier of the store in MiB (0: every lookup reads the disk); with --memory-store the whole store, which must hold one example's caches (FusionRAG: its chunks', their neighbours' and the enriched ones per chunk context: evicted enriched caches are computed again, and the bench stops when they still do not fit)")
      ->capture_default_str();
  cmd->add_flag("--no-report", a->no_report, "do not run tools/bench_report.py at the end");
  cmd->add_option("--reference-cache", a->reference_cache,
                  "folder keeping full prefill's answer and first-token logits per prompt, so a run adding methods "
                  "or resuming does not prefill each prompt again (valid for this binary, ISA and thread count only; "
                  "default <cache>/bench_references)");
  cmd->add_flag("--no-reference-cache", a->no_reference_cache, "always run full prefill for the reference");
  cmd->add_flag("--peer", a->peer,
                "after the run, time llama.cpp's full prefill of the same prompt ids (<out>/prompts.jsonl) with "
                "bench/llamacpp_peer.py, same GGUF and threads, into <out>/peer.jsonl; the report then adds "
                "speedups vs llama.cpp");
  cmd->add_option("--peer-python", a->peer_python, "Python with llama_cpp for --peer (default: <repo>/.venv/bin/python)");
  cmd->footer(
      "Datasets: nq_open_oracle adds 9 other examples' gold passages as distractors (seeded, gold at a seeded "
      "position); kv_retrieval puts 5 key-value pairs in each chunk; rgb_en_fact uses positive + negative "
      "passages in a seeded order (CC BY-NC-SA 4.0, evaluation only); ruler:TASK:LENGTH is generated with the "
      "model's tokenizer at LENGTH context tokens in chunks of at most 512 tokens. The 'match' column is RULER's "
      "string match (share of the gold strings found in the answer where all are required, else any).\n"
      "Outputs in --out: results.jsonl (one row per example x method x ratio, resumable), prompts.jsonl (each "
      "example's prompt ids, for the llama.cpp peer), peer.jsonl (with --peer), bench_command.txt, report.md, "
      "summary.csv, *.png. Reproduction commands: bench/README.md.");
}

}  // namespace cf::apps

#include "eval/runner.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "base/clock.h"
#include "base/progress.h"
#include "eval/bench_request.h"
#include "eval/metrics.h"
#include "eval/reference_cache.h"
#include "fusion/auto_quality.h"
#include "fusion/executor.h"
#include "fusion/fusion_options.h"
#include "fusion/fusionrag_enrich.h"
#include "fusion/methods.h"
#include "kv/chunk_store.h"
#include "model/kernels.h"
#include "runtime/generate.h"

namespace cf::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string ratio_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", r);
  return buf;
}

std::string fingerprint_hex(uint64_t f) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(f));
  return buf;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The selector a run's method name stands for: a method preset's "method", else itself.
std::string selector_of(const nlohmann::json& method_presets, const std::string& method) {
  if (method_presets.is_object() && method_presets.contains(method)) return method_presets.at(method).at("method").get<std::string>();
  return method;
}

// Whether some run uses `selector`, directly or through a method preset.
bool uses_corpus_enrichment(const std::vector<BenchRun>& runs, const nlohmann::json& method_presets) {
  return std::any_of(runs.begin(), runs.end(),
                     [&](const BenchRun& r) { return enriches_from_corpus(selector_of(method_presets, r.method)); });
}

}  // namespace

nlohmann::json bench_default_method_options(const std::string& method) {
  const MethodEntry* e = find_method(method);
  return e ? nlohmann::json::parse(e->bench_options) : nlohmann::json::object();
}

void check_method_presets(const nlohmann::json& method_presets) {
  if (!method_presets.is_object()) throw std::invalid_argument("method presets must be a JSON object {name: {method, options}}");
  for (const auto& [name, v] : method_presets.items()) {
    if (name.empty() || find_method(name))
      throw std::invalid_argument("method preset '" + name + "': the name must differ from every method");
    if (!v.is_object() || !v.contains("method") || !v["method"].is_string())
      throw std::invalid_argument("method preset '" + name + "': expected {\"method\": \"<selector>\", \"options\": {...}}");
    for (const auto& [key, _] : v.items())
      if (key != "method" && key != "options")
        throw std::invalid_argument("method preset '" + name + "': unknown field '" + key + "' (known: method, options)");
    std::unique_ptr<Selector> sel;
    try {
      sel = make_selector(v["method"].get<std::string>());
      sel->configure(v.contains("options") ? v.at("options") : nlohmann::json::object());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("method preset '" + name + "': " + e.what());
    }
  }
}

nlohmann::json qcfuse_ablation_presets() {
  using J = nlohmann::json;
  return J{
      {"prophet:suffix_rows", {{"method", "prophet"}, {"options", {{"probe_rows", "suffix"}}}}},
      {"qcfuse:a1_all", {{"method", "qcfuse"}, {"options", {{"anchor_ratio", 1.0}, {"layers", "all"}}}}},
      {"qcfuse:a1_critical", {{"method", "qcfuse"}, {"options", {{"anchor_ratio", 1.0}}}}},
      {"qcfuse:a0.1_all", {{"method", "qcfuse"}, {"options", {{"layers", "all"}}}}},
      {"qcfuse:middle", {{"method", "qcfuse"}, {"options", {{"layers", "middle"}}}}},
      {"qcfuse:top1", {{"method", "qcfuse"}, {"options", {{"layers", "top1"}}}}},
      {"qcfuse:last", {{"method", "qcfuse"}, {"options", {{"layers", "last"}}}}},
      {"qcfuse:suffix_rows", {{"method", "qcfuse"}, {"options", {{"probe_rows", "suffix"}}}}},
      {"qcfuse:shared_anchors", {{"method", "qcfuse"}, {"options", {{"anchors", "shared"}}}}},
      {"qcfuse:no_sinks", {{"method", "qcfuse"}, {"options", {{"anchor_sinks", false}}}}},
      {"qcfuse:evidence_profile", {{"method", "qcfuse"}, {"options", {{"profile", "evidence"}}}}},
      {"qcfuse:before_issue16",
       {{"method", "qcfuse"},
        {"options", {{"probe_rows", "suffix"}, {"anchors", "shared"}, {"anchor_sinks", false}, {"profile", "evidence"}}}}},
  };
}

double jaccard(const std::vector<size_t>& a, const std::vector<size_t>& b) {
  if (a.empty() && b.empty()) return 1.0;
  std::vector<size_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return static_cast<double>(both.size()) / static_cast<double>(a.size() + b.size() - both.size());
}

std::vector<BenchRun> expand_runs(const std::vector<std::string>& methods, const std::vector<double>& ratios,
                                  const nlohmann::json& method_presets, const std::vector<double>& qualities,
                                  const std::vector<double>& ttft_budgets) {
  std::vector<BenchRun> runs;
  std::set<std::string> seen;
  // One run of auto per distinct value, each judged by the request's own rule
  // (validate_fusion_options) and refused under the bench's option name.
  const auto add_targets = [&runs](const std::string& m, const std::vector<double>& values, const char* option,
                                   bool budget) {
    std::set<std::string> seen_values;
    for (double v : values) {
      FusionOptions fo;
      fo.method = m;
      (budget ? fo.ttft_ms : fo.quality) = v;
      try {
        if (!budget) autoq::check_quality(v);
        validate_fusion_options(fo, OptionsSource::trusted);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string(option) + " " + ratio_text(v) + ": " + e.what());
      }
      if (seen_values.insert(ratio_text(v)).second) runs.push_back({m, v, budget});
    }
  };
  for (const auto& m : methods) {
    if (!seen.insert(m).second) continue;
    const MethodEntry* entry = find_method(m);
    if (entry && !entry->takes_ratio()) {
      runs.push_back({m, entry->fixed_ratio});
    } else if (entry && entry->kind == MethodKind::automatic) {
      if (qualities.empty() && ttft_budgets.empty())
        throw std::invalid_argument("method 'auto' needs at least one --qualities or --ttft-budgets value");
      add_targets(m, qualities, "--qualities", false);
      add_targets(m, ttft_budgets, "--ttft-budgets", true);
    } else {
      if (!entry && !(method_presets.is_object() && method_presets.contains(m))) {
        std::string names = known_methods_text();
        if (method_presets.is_object())
          for (const auto& [k, _] : method_presets.items()) names += ", " + k;
        throw std::invalid_argument("unknown method '" + m + "' (known: " + names + ")");
      }
      if (ratios.empty()) throw std::invalid_argument("method '" + m + "' needs at least one --ratios value");
      std::set<std::string> seen_ratios;
      for (double r : ratios) {
        if (!(r >= 0.0 && r <= 1.0)) throw std::invalid_argument("ratio " + ratio_text(r) + " is outside [0, 1]");
        if (seen_ratios.insert(ratio_text(r)).second) runs.push_back({m, r});
      }
    }
  }
  if (runs.empty()) throw std::invalid_argument("no methods to run");
  return runs;
}

std::string row_key(const std::string& dataset, uint64_t model_fingerprint, const std::string& example_id,
                    const std::string& method, double ratio, ChunkContext chunk_context, bool ttft_budget) {
  return dataset + "\x1f" + fingerprint_hex(model_fingerprint) + "\x1f" + example_id + "\x1f" + method + "\x1f" +
         ratio_text(ratio) + (chunk_context == ChunkContext::prefixed && !is_full_prefill(method) ? "\x1fprefixed" : "") +
         (ttft_budget ? "\x1fttft_ms" : "");
}

std::string dataset_label(const std::string& dataset_name, size_t chunk_tokens, size_t chunks_per_request) {
  std::string label = chunk_tokens ? dataset_name + "@" + std::to_string(chunk_tokens) + "tok" : dataset_name;
  if (chunks_per_request) label += " x" + std::to_string(chunks_per_request);
  return label;
}

std::string results_line(const json& row) { return row.dump(-1, ' ', false, json::error_handler_t::replace); }

std::vector<json> read_results(const std::string& path) {
  std::vector<json> rows;
  std::error_code ec;
  if (!fs::exists(path, ec)) return rows;
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (complete < text.size()) {  // a run killed mid-write: drop the partial line
    std::fprintf(stderr, "bench: %s ends in a half-written line; removing it\n", path.c_str());
    fs::resize_file(path, complete);
    text.resize(complete);
  }
  size_t line_no = 0, begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    ++line_no;
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw std::runtime_error(path + ":" + std::to_string(line_no) +
                               ": not a JSON object; fix or remove the line, or use a fresh --out");
    rows.push_back(std::move(j));
  }
  return rows;
}

namespace {

// Every run once per chunk context; full once (it looks no chunk up).
std::vector<BenchRun> planned_runs(const BenchConfig& cfg) {
  if (cfg.chunk_contexts.empty()) throw std::invalid_argument("bench: no chunk context to run");
  std::vector<BenchRun> runs;
  for (size_t v = 0; v < cfg.chunk_contexts.size(); ++v)
    for (BenchRun r : expand_runs(cfg.methods, cfg.ratios, cfg.method_presets, cfg.qualities, cfg.ttft_budgets)) {
      if (is_full_prefill(r.method) && v > 0) continue;
      r.chunk_context = is_full_prefill(r.method) ? ChunkContext::alone : cfg.chunk_contexts[v];
      runs.push_back(r);
    }
  return runs;
}

// The dataset indices this run covers: --from up to --limit, this shard's only. A shard is
// taken by absolute index, so a resumed or extended shard keeps its examples.
std::vector<size_t> planned_examples(const BenchConfig& cfg, size_t dataset_size) {
  const size_t n_examples = cfg.limit ? std::min(cfg.limit, dataset_size) : dataset_size;
  if (cfg.shard_count == 0 || cfg.shard_index >= cfg.shard_count)
    throw std::invalid_argument("bench: shard " + std::to_string(cfg.shard_index) + "/" +
                                std::to_string(cfg.shard_count) + " does not exist");
  if (cfg.first_example && cfg.first_example >= n_examples)
    throw std::invalid_argument("bench: --from " + std::to_string(cfg.first_example) + " leaves no examples (the plan has " +
                                std::to_string(n_examples) + ")");
  std::vector<size_t> examples;
  for (size_t e = cfg.first_example; e < n_examples; ++e)
    if (e % cfg.shard_count == cfg.shard_index) examples.push_back(e);
  return examples;
}

// Rows written before rows named their prompt layout were made with this one.
std::string first_layout_id() {
  RagPromptOptions first;
  first.system = "You are a helpful assistant. Answer the question using the passages. Answer briefly.";
  first.question_cue.clear();
  return prompt_layout_id(first);
}

// The row keys already in `results_path` (a resumed bench skips them). Rows of this dataset and
// model made with another max_tokens or another prompt layout cannot be mixed with new ones: throws.
std::set<std::string> rows_present(const std::string& results_path, const std::string& label, uint64_t fp,
                                   int max_tokens, const std::string& layout) {
  std::set<std::string> done;
  const std::string first_layout = first_layout_id();
  for (const json& row : read_results(results_path)) {
    if (!row.contains("dataset") || !row.contains("example") || !row.contains("method") || !row.contains("ratio"))
      continue;
    const bool same_data = row.value("dataset", "") == label && row.value("model_fingerprint", "") == fingerprint_hex(fp);
    if (same_data && row.value("max_tokens", 0) != max_tokens)
      throw std::runtime_error(results_path + " holds rows of this dataset and model made with max_tokens " +
                               std::to_string(row.value("max_tokens", 0)) + "; use a fresh --out or the same settings");
    if (same_data && row.value("prompt_layout", first_layout) != layout)
      throw std::runtime_error(results_path + " holds rows of this dataset and model made with another prompt layout (" +
                               row.value("prompt_layout", first_layout) + ", this run's is " + layout +
                               ": --system/--question-cue or the defaults changed); use a fresh --out or the same words");
    uint64_t row_fp = std::strtoull(row.value("model_fingerprint", "0").c_str(), nullptr, 16);
    ChunkContext chunk_context = ChunkContext::alone;
    // "chunk_context"; rows written before issue 25 name it "chunk_variant".
    parse_chunk_context(row.value("chunk_context", row.value("chunk_variant", "alone")), chunk_context);
    done.insert(row_key(row["dataset"].get<std::string>(), row_fp, row["example"].get<std::string>(),
                        row["method"].get<std::string>(), row["ratio"].get<double>(), chunk_context,
                        row.contains("ttft_budget_ms")));
  }
  return done;
}

ChunkStoreOptions bench_store_options(const BenchConfig& cfg, const Model& model) {
  ChunkStoreOptions so;
  if (!cfg.memory_only_store)
    so.dir = cfg.store_dir.empty() ? (fs::path(cfg.out_dir) / "store").string() : cfg.store_dir;
  so.disk_dtype = cfg.disk_dtype;
  so.memory_budget_bytes = cfg.memory_budget_bytes;
  so.durable = false;  // still atomic; a damaged file is detected and recomputed
  so.model = StoreModel{model.fingerprint(), model.hparams()};
  return so;
}

// prompts.jsonl: each example's prompt tokens for the llama.cpp peer, once per (dataset, model,
// example), appended as the bench goes.
class PromptLog {
 public:
  explicit PromptLog(const std::string& out_dir) : path_((fs::path(out_dir) / "prompts.jsonl").string()) {
    for (const json& row : read_results(path_))
      done_.insert(row.value("dataset", "") + "\x1f" + row.value("model_fingerprint", "") + "\x1f" +
                   row.value("example", ""));
    out_.open(path_, std::ios::app | std::ios::binary);
    if (!out_) throw std::runtime_error("cannot append to " + path_);
  }
  static std::string key(const std::string& label, uint64_t fp, const std::string& example) {
    return label + "\x1f" + fingerprint_hex(fp) + "\x1f" + example;
  }
  bool has(const std::string& key) const { return done_.count(key) != 0; }
  void add(const std::string& key, json row) {
    if (!done_.insert(key).second) return;
    out_ << results_line(row) << '\n';
    out_.flush();
    if (!out_) throw std::runtime_error("write to " + path_ + " failed");
  }

 private:
  std::string path_;
  std::set<std::string> done_;
  std::ofstream out_;
};

// Step (1) of an example: its chunk caches (and FusionRAG's enriched caches), untimed, as a
// deployment computes them when a passage is indexed.
struct OfflineWork {
  double chunk_ms = 0;  // base chunk caches (and the base caches of FusionRAG's neighbours)
  size_t chunks_computed = 0;
  // FusionRAG's enrichment per chunk context, charged to the example's first FusionRAG row of
  // that context (then zeroed).
  std::map<ChunkContext, double> fusionrag_ms;
  // Per chunk context: this example's chunks that have an enriched cache after step (1).
  std::map<ChunkContext, size_t> fusionrag_enriched;
};

// One FusionRAG enrichment pass of an example's chunks, charged to its offline work (the
// neighbours' base caches it computed as chunk caches, the rest to FusionRAG).
void charge_enrichment(OfflineWork& w, const EnrichReport& rep, ChunkContext v) {
  w.chunk_ms += rep.pic_ms;
  w.chunks_computed += rep.pic_computed;
  w.fusionrag_ms[v] += rep.similarity_ms;
  for (double ms : rep.enrich_ms) w.fusionrag_ms[v] += ms;
}

OfflineWork prepare_chunk_caches(Forward& fwd, ChunkStore& store, const BenchConfig& cfg, const RagRequest& req,
                                 const std::vector<BenchRun>& todo, const std::vector<CorpusChunk>& fusionrag_kb) {
  const uint64_t fp = fwd.model().fingerprint();
  OfflineWork w;
  for (const ChunkContext v : cfg.chunk_contexts) {
    if (std::none_of(todo.begin(), todo.end(), [&](const BenchRun& r) { return r.chunk_context == v; })) continue;
    for (const auto& chunk : req.chunks) {
      const ChunkKey key = base_chunk_key(fp, chunk, v, req.system);
      store.get_or_compute(key, [&] {
        ChunkCache c = compute_chunk_cache(fwd, key, base_chunk_prefix(v, req.system));
        w.chunk_ms += c.offline_ms;
        ++w.chunks_computed;
        return c;
      });
    }
  }
  // FusionRAG's offline enrichment of this example's chunks (eq. 10), per chunk context (its
  // base caches and neighbours are of that context). Base caches of neighbours from other
  // examples count as chunk caches (a deployment has them all).
  for (const ChunkContext v : cfg.chunk_contexts) {
    if (std::none_of(todo.begin(), todo.end(),
                     [&](const BenchRun& r) { return r.chunk_context == v && enriches_from_corpus(selector_of(cfg.method_presets, r.method)); }))
      continue;
    const EnrichReport rep = enrich_request_chunks(fwd, store, req, fusionrag_kb, v);
    w.fusionrag_enriched[v] = rep.enriched + rep.enriched_present;
    charge_enrichment(w, rep, v);
  }
  return w;
}

// A FusionRAG run on the enriched caches step (1) made. A memory store too small for one
// example's caches (its base caches, their neighbours' and the enriched ones, per chunk
// context) evicts some before the run, and FusionRAG would silently serve base caches for them
// (issue 23's 1.5B rows at --memory-mb 512 did): the evicted ones are computed again (offline,
// charged to this row) and the run repeated; if they still do not fit, an error.
FusionResult fusionrag_prefill(FusionExecutor& executor, Forward& fwd, ChunkStore& store, const RagRequest& req,
                               const std::vector<CorpusChunk>& fusionrag_kb, const FusionOptions& fo,
                               OfflineWork& offline, const std::string& example) {
  const size_t want = offline.fusionrag_enriched[fo.chunk_context];
  FusionResult r = executor.prefill(req, fo);
  for (int again = 0;; ++again) {
    const size_t got = r.selection_details.value("enriched_chunks", size_t{0});
    if (got >= want) return r;
    if (again == 1)
      throw std::runtime_error("bench: example " + example + ": the chunk store's memory budget cannot hold its " +
                               std::to_string(want) + " FusionRAG enriched caches with their base caches (" +
                               std::to_string(got) + " left); raise --memory-mb");
    std::fprintf(stderr, "\nbench: example %s: %zu of %zu enriched caches were evicted from the chunk store before "
                 "FusionRAG ran; computing them again (a larger --memory-mb avoids this)\n",
                 example.c_str(), want - got, want);
    charge_enrichment(offline, enrich_request_chunks(fwd, store, req, fusionrag_kb, fo.chunk_context), fo.chunk_context);
    r = executor.prefill(req, fo);
  }
}

// The options a run's method runs with, and (in `base`) the selector it stands for: --method-
// options of the method (or the bench's default), and for a method preset its selector's with
// the preset's own options over them.
json options_of(const BenchConfig& cfg, const std::string& method, std::string& base) {
  base = selector_of(cfg.method_presets, method);
  json options = cfg.method_options.contains(method) ? cfg.method_options.at(method) : bench_default_method_options(method);
  if (base != method) {
    const json& v = cfg.method_presets.at(method);
    options = cfg.method_options.contains(base) ? cfg.method_options.at(base) : bench_default_method_options(base);
    if (!options.is_object()) options = json::object();
    if (v.contains("options"))
      for (auto it = v.at("options").begin(); it != v.at("options").end(); ++it) options[it.key()] = it.value();
  }
  return options;
}

// What every row of one example shares.
struct ExampleContext {
  const std::string& label;
  uint64_t fp;
  const QaExample& ex;
  size_t index;
  const RagRequest& req;
  const std::vector<TokenId>& prompt;
  const std::vector<float>& full_logits;  // full prefill's first output token
  const DecodedAnswer& full_dec;
  uint64_t seed;
  double load_avg;
};

// One results.jsonl row: the answer's quality against gold and against full prefill, the
// timings, and what the method did.
json result_row(const BenchConfig& cfg, const ExampleContext& x, const BenchRun& run, const std::string& base,
                const json& options, const FusionResult& r, const DecodedAnswer& dec, std::optional<double> jac,
                const OfflineWork& offline) {
  const FusionTimings& t = r.timings;
  const auto& gold = x.ex.answers;
  const double fusionrag_ms = enriches_from_corpus(base) && offline.fusionrag_ms.count(run.chunk_context)
                                  ? offline.fusionrag_ms.at(run.chunk_context)
                                  : 0.0;
  json row{{"dataset", x.label},
           {"model", cfg.model_name},
           {"model_fingerprint", fingerprint_hex(x.fp)},
           {"example", x.ex.id},
           {"example_index", x.index},
           {"method", run.method},
           {"ratio", run.ratio},
           {"answer", dec.answer},
           {"gold", gold},
           {"full_answer", x.full_dec.answer},
           {"f1", qa_f1(dec.answer, gold)},
           {"em", exact_match(dec.answer, gold)},
           {"rouge_l", rouge_l(dec.answer, gold)},
           {"string_match", x.ex.all_answers_required ? string_match_all(dec.answer, gold)
                                                      : string_match_part(dec.answer, gold)},
           {"fidelity_f1", fidelity_f1(dec.answer, x.full_dec.answer)},
           {"first_token_agree", first_token_agrees(x.full_logits, r.logits)},
           {"kl", kl_divergence_from_logits(x.full_logits, r.logits)},
           {"ttft_ms", t.ttft_ms},
           {"lookup_ms", t.lookup_ms},
           {"load_ms", t.load_ms},
           {"selection_ms", t.selection_ms},
           {"recompute_ms", t.recompute_ms},
           {"method_offline_ms", t.offline_ms + fusionrag_ms},
           {"chunk_offline_ms", offline.chunk_ms},
           {"chunks", x.req.chunks.size()},
           {"chunk_tokens", cfg.chunk_tokens},
           {"chunks_computed", offline.chunks_computed},
           {"recomputed_tokens", r.recomputed.size()},
           {"context_tokens", r.context_tokens},
           {"prompt_tokens", x.prompt.size()},
           {"generated_tokens", dec.tokens},
           {"stop_reason", dec.stop_reason},
           {"decode_tok_s", dec.decode_tok_s},
           {"max_tokens", cfg.max_tokens},
           {"prompt_layout", prompt_layout_id(cfg.prompt)},
           {"seed", x.seed},
           {"threads", cfg.threads},
           {"store", cfg.memory_only_store ? "memory" : std::string("disk-") + dtype_name(cfg.disk_dtype)},
           {"load_avg_1m", x.load_avg},
           // TTFTs compare only between rows of the same kernels (a resumed run may be on
           // another CPU); bench_report pairs them by it.
           {"isa", isa_name(active_isa())}};
  if (base != run.method) {
    row["base_method"] = base;
    row["method_options"] = options;
  }
  if (is_auto_policy(base)) {
    row[run.ttft_budget ? "ttft_budget_ms" : "quality"] = run.ratio;
    row["auto"] = r.auto_decision;
  }
  if (jac) {
    row["jaccard_ref"] = *jac;
    row["jaccard_reference"] = cfg.jaccard_reference;
  }
  // What the ablation attributes to each part (QCFuse and ProphetKV report them).
  for (const char* k : {"critical_layers", "anchors", "anchor_rule", "probe_rows", "probe_depth", "probe_ms", "score_ms"})
    if (r.selection_details.is_object() && r.selection_details.contains(k)) row[k] = r.selection_details[k];
  if (!is_full_prefill(run.method)) row["chunk_context"] = chunk_context_name(run.chunk_context);
  if (r.selection_details.is_object() && r.selection_details.contains("enriched_chunks"))  // FusionRAG
    row["enriched_chunks"] = r.selection_details["enriched_chunks"];
  return row;
}

}  // namespace

BenchRunner::BenchRunner(Forward& fwd, BenchConfig cfg) : fwd_(fwd), cfg_(std::move(cfg)) {
  if (cfg_.out_dir.empty()) throw std::invalid_argument("bench: an output folder is required");
  if (cfg_.max_tokens < 1) throw std::invalid_argument("bench: max_tokens must be at least 1");
}

BenchSummary BenchRunner::run(const Dataset& dataset) {
  const double t_start = now_ms();
  check_method_presets(cfg_.method_presets);
  const std::vector<BenchRun> runs = planned_runs(cfg_);
  const Model& model = fwd_.model();
  const uint64_t fp = model.fingerprint();
  fs::create_directories(cfg_.out_dir);
  BenchSummary sum;
  sum.results_path = (fs::path(cfg_.out_dir) / "results.jsonl").string();
  const std::string label = dataset_label(dataset.name, cfg_.chunk_tokens, cfg_.chunks_per_request);
  const std::set<std::string> done = rows_present(sum.results_path, label, fp, cfg_.max_tokens, prompt_layout_id(cfg_.prompt));

  // This shard's examples, and the runs each still lacks.
  const std::vector<size_t> examples = planned_examples(cfg_, dataset.examples.size());
  sum.examples = examples.size();
  std::vector<std::vector<BenchRun>> todo(dataset.examples.size());
  size_t total_units = 0;
  for (size_t e : examples) {
    for (const auto& r : runs) {
      if (done.count(row_key(label, fp, dataset.examples[e].id, r.method, r.ratio, r.chunk_context, r.ttft_budget)))
        ++sum.rows_already_present;
      else
        todo[e].push_back(r);
    }
    total_units += todo[e].size();
  }

  ChunkStore store(bench_store_options(cfg_, model));
  FusionExecutor executor(fwd_, store);
  std::ofstream out(sum.results_path, std::ios::app | std::ios::binary);
  if (!out) throw std::runtime_error("cannot append to " + sum.results_path);
  PromptLog prompts(cfg_.out_dir);
  const ReferenceCache references(cfg_.reference_cache_dir);

  // FusionRAG's knowledge base (§3.1): every chunk of the dataset (dataset_knowledge_base).
  const bool wants_fusionrag =
      std::any_of(todo.begin(), todo.end(), [&](const std::vector<BenchRun>& t) { return uses_corpus_enrichment(t, cfg_.method_presets); });
  std::vector<CorpusChunk> fusionrag_kb;
  if (wants_fusionrag) {
    fusionrag_kb = dataset_knowledge_base(model, dataset, cfg_.prompt, cfg_.chunk_tokens);
    std::fprintf(stderr, "bench: FusionRAG knowledge base: %zu chunks of %zu examples\n", fusionrag_kb.size(),
                 dataset.examples.size());
  }

  ProgressBar progress(total_units, "runs", cfg_.progress);
  size_t units = 0;
  bool warmed_up = false;
  progress.update(0, "");
  for (size_t e : examples) {
    const QaExample& ex = dataset.examples[e];
    const std::string prompt_key = PromptLog::key(label, fp, ex.id);
    if (todo[e].empty() && prompts.has(prompt_key)) continue;
    const RagRequest req = cfg_.chunks_per_request
                               ? build_example_request_filled(model, dataset, e, cfg_.prompt, cfg_.chunk_tokens,
                                                              cfg_.chunks_per_request)
                               : build_example_request(model, ex, cfg_.prompt, cfg_.chunk_tokens);
    const std::vector<TokenId> prompt = req.flatten();
    if (static_cast<long>(prompt.size()) + cfg_.max_tokens > model.hparams().context_length) {
      if (todo[e].empty()) continue;
      std::fprintf(stderr, "\nbench: example %s: %zu prompt tokens + %d to generate exceed the context of %d; skipped\n",
                   ex.id.c_str(), prompt.size(), cfg_.max_tokens, model.hparams().context_length);
      ++sum.examples_skipped;
      units += todo[e].size();
      continue;
    }
    prompts.add(prompt_key, json{{"dataset", label},           {"model", cfg_.model_name},
                                 {"model_fingerprint", fingerprint_hex(fp)}, {"example", ex.id},
                                 {"threads", cfg_.threads},     {"tokens", prompt}});
    if (todo[e].empty()) continue;
    ++sum.examples_run;

    // (1) Chunk caches, untimed.
    OfflineWork offline = prepare_chunk_caches(fwd_, store, cfg_, req, todo[e], fusionrag_kb);
    // The first timed run of a process would pay for page faults of the weights and the
    // prefix cache of S: a reuse prefill (every weight, S cached) takes them first.
    if (!warmed_up) {
      executor.prefill(req, {"reuse", 0.0, 0});  // any cheap method warms up
      warmed_up = true;
    }

    // (2) The reference: cached, unless the full row itself is still to do (its TTFT is measured).
    const bool full_row_todo =
        std::any_of(todo[e].begin(), todo[e].end(), [](const BenchRun& r) { return is_full_prefill(r.method); });
    const std::string reference_key = references.key(fp, prompt, cfg_.max_tokens, cfg_.threads);
    std::optional<FusionResult> full;
    std::optional<ReferenceRecord> reference = full_row_todo ? std::nullopt : references.load(reference_key);
    if (reference) {
      ++sum.references_reused;
    } else {
      full.emplace(executor.prefill(req, {full_method_name(), 1.0, cfg_.seed}));
      reference = ReferenceRecord{full->logits, decode_answer(fwd_, *full, prompt, cfg_.max_tokens)};
      references.save(reference_key, *reference);
    }
    const DecodedAnswer& full_dec = reference->answer;
    double load_avg[1] = {0};
    if (getloadavg(load_avg, 1) != 1) load_avg[0] = -1;
    const ExampleContext x{label, fp,        ex,       e, req, prompt, reference->logits, full_dec,
                           cfg_.seed * 1000003ull + e, load_avg[0]};

    // (3) Every method x ratio still to do; the Jaccard reference first, so its selections
    // are at hand for the others.
    std::stable_partition(todo[e].begin(), todo[e].end(),
                          [&](const BenchRun& r) { return r.method == cfg_.jaccard_reference; });
    std::map<std::string, std::vector<size_t>> reference_slots;  // by ratio text and chunk context
    for (const BenchRun& run : todo[e]) {
      progress.update(units, ex.id + " " + run.method + "@" + ratio_text(run.ratio) + (run.ttft_budget ? "ms" : "") +
                                 (run.chunk_context == ChunkContext::prefixed ? " prefixed" : ""));
      std::optional<FusionResult> own;
      DecodedAnswer dec = full_dec;
      std::string base = run.method;
      json options = json::object();
      std::optional<double> jac;
      if (!is_full_prefill(run.method)) {
        options = options_of(cfg_, run.method, base);
        FusionOptions fo{base, run.ratio, x.seed, options, run.chunk_context};
        if (is_auto_policy(base))  // the target or the budget; the policy picks the ratio
          (run.ttft_budget ? fo.ttft_ms : fo.quality) = run.ratio;
        own.emplace(enriches_from_corpus(base) ? fusionrag_prefill(executor, fwd_, store, req, fusionrag_kb, fo, offline, ex.id)
                                        : executor.prefill(req, fo));
        dec = decode_answer(fwd_, *own, prompt, cfg_.max_tokens);
        if (!cfg_.jaccard_reference.empty() && find_method(base) && find_method(base)->takes_ratio() && !is_auto_policy(base)) {
          const std::string rk = ratio_text(run.ratio) + " " + chunk_context_name(run.chunk_context);
          if (run.method == cfg_.jaccard_reference) reference_slots[rk] = own->recomputed;
          if (!reference_slots.count(rk)) {  // untimed, not recorded
            std::string ref_base;
            const json ref_options = options_of(cfg_, cfg_.jaccard_reference, ref_base);
            reference_slots[rk] =
                executor.prefill(req, {ref_base, run.ratio, x.seed, ref_options, run.chunk_context}).recomputed;
          }
          jac = jaccard(own->recomputed, reference_slots[rk]);
        }
      }
      out << results_line(result_row(cfg_, x, run, base, options, own ? *own : *full, dec, jac, offline)) << '\n';
      if (enriches_from_corpus(base)) offline.fusionrag_ms[run.chunk_context] = 0;  // counted once per example and chunk context
      out.flush();
      if (!out) throw std::runtime_error("write to " + sum.results_path + " failed");
      ++sum.rows_written;
      ++units;
    }
    progress.update(units, ex.id);
  }
  progress.update(total_units, "done");
  sum.seconds = (now_ms() - t_start) / 1000;
  return sum;
}

int run_tool_script(const std::string& relative_script, const std::string& out_dir, std::string& how_to,
                    const std::string& python) {
  const auto root = find_repo_root();
  const std::string script = root ? (fs::path(*root) / relative_script).string() : relative_script;
  std::error_code ec;
  if (!root || !fs::exists(script, ec)) {
    how_to = "script not found; from the repository root run: python3 " + relative_script + " " + out_dir;
    return -1;
  }
  // The bench venv of scripts/setup.sh --bench has matplotlib for the plots.
  const fs::path venv_python = fs::path(*root) / ".venv" / "bin" / "python";
  std::string interpreter = !python.empty() ? python : fs::exists(venv_python, ec) ? venv_python.string() : "python3";
  how_to = interpreter + " " + script + " " + out_dir;
  if (interpreter == "python3" && std::system("command -v python3 >/dev/null 2>&1") != 0) {
    how_to = "python3 not found; with Python 3 run: " + how_to;
    return -1;
  }
  const int rc =
      std::system((shell_quote(interpreter) + " " + shell_quote(script) + " " + shell_quote(out_dir)).c_str());
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

int run_report(const std::string& out_dir, std::string& how_to) {
  return run_tool_script("tools/bench_report.py", out_dir, how_to);
}

int run_peer(const std::string& out_dir, const std::string& model_path, int threads, const std::string& python,
             std::string& how_to) {
  const auto root = find_repo_root();
  const std::string script = root ? (fs::path(*root) / "bench" / "llamacpp_peer.py").string() : "bench/llamacpp_peer.py";
  const std::string interpreter =
      !python.empty() ? python : (root ? (fs::path(*root) / ".venv" / "bin" / "python").string() : ".venv/bin/python");
  const std::string cmd = shell_quote(interpreter) + " " + shell_quote(script) + " " + shell_quote(out_dir) +
                          " --model " + shell_quote(model_path) + " --threads " + std::to_string(threads);
  how_to = cmd;
  std::error_code ec;
  if (!root || !fs::exists(script, ec)) {
    how_to = "peer script not found; from the repository root run: " + cmd;
    return -1;
  }
  if (!fs::exists(interpreter, ec)) {
    how_to = interpreter + " not found (scripts/setup.sh --bench makes .venv with llama-cpp-python); then run: " + cmd;
    return -1;
  }
  const int rc = std::system(cmd.c_str());
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

}  // namespace cf::eval

// The benchmark runner behind `chunkfuse bench` (issue 4, items 1 and 5): every example of a
// dataset through full prefill and each method x ratio, one JSON line per
// (example, method, ratio) appended to <out>/results.jsonl as it finishes.
//
// Per example: (1) the chunk caches of its passages are computed into the store first,
// untimed (their cost is recorded as chunk_offline_ms); (2) full prefill runs once: its
// answer and first-token distribution are the reference for fidelity (taken from the
// reference cache when the example's full row is already written and this binary made
// one, reference_cache.h); (3) each method x
// ratio runs FusionExecutor::prefill then greedy decoding (Generator::continue_from, up to
// max_tokens, stopping at end of generation or a newline). `full` and `reuse` run once per
// example (recorded at ratio 1 and 0), the other methods once per ratio.
//
// FusionRAG needs its offline stage: before an example's first FusionRAG run its chunks are
// enriched (enrich_corpus, n = 10 BM25 neighbours) against a knowledge base made of every
// chunk of every example of the dataset; the enrichment time (similarity search + eq. 10
// passes) is that example's FusionRAG offline cost, recorded on its first FusionRAG row.
//
// Re-chunking (chunk_tokens > 0, see bench_request.h) changes the prompt, so its rows carry
// the dataset name "<name>@<N>tok" and never mix with passage-as-chunk rows.
//
// For the llama.cpp peer (bench/llamacpp_peer.py) every example that fits the context gets
// one line in <out>/prompts.jsonl: {dataset, model, model_fingerprint, example, threads,
// tokens:[the full-prefill prompt's ids]}, written once per (dataset, model, example).
//
// Resumable: rows already in results.jsonl (same dataset, model, example, method, ratio)
// are skipped; an example with nothing left to do is not even loaded into the model. A
// half-written last line (a killed run) is cut off before appending.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/datasets.h"
#include "fusion/rag_prompt.h"
#include "kv/cache_file.h"
#include "runtime/forward.h"

namespace cf::eval {

struct BenchConfig {
  std::vector<std::string> methods;  // "full" and/or selector names
  std::vector<double> ratios;        // for the methods other than full and reuse
  std::vector<double> qualities;     // for "auto": its quality targets (expand_runs)
  std::vector<double> ttft_budgets;  // for "auto": its first-token budgets in ms (expand_runs)
  size_t limit = 0;                  // first N examples; 0: all
  size_t first_example = 0;          // of those, start at this index (extends a run to more examples)
  size_t shard_index = 0, shard_count = 1;  // of those, only the indices = shard_index mod shard_count
  int max_tokens = 32;
  uint64_t seed = 0;
  std::string out_dir;
  std::string store_dir;             // empty: <out_dir>/store
  bool memory_only_store = false;    // no disk tier (store_dir ignored)
  KvDtype disk_dtype = KvDtype::f16;
  size_t memory_budget_bytes = size_t{512} << 20;
  RagPromptOptions prompt;
  size_t chunk_tokens = 0;           // 0: passage-as-chunk; N: fixed-size re-chunking
  std::string model_name;            // recorded in each row (e.g. the GGUF file name)
  int threads = 0;                   // recorded in each row
  bool progress = true;              // progress bar with ETA on stderr
  // Selector::configure options per method name ({"qcfuse": {...}}). Methods not named get
  // bench_default_method_options(method).
  nlohmann::json method_options = nlohmann::json::object();
  // Method presets: named option sets of a method ({"qcfuse:top1": {"method": "qcfuse",
  // "options": {...}}}, bench --method-presets): a name listed in `methods` that is a preset
  // runs its method with its options (over the method's --method-options) and its rows carry the
  // preset's name as "method", the selector as "base_method" (issue 16's ablation: one code
  // path per idea, the options select among them).
  nlohmann::json method_presets = nlohmann::json::object();
  // Non-empty ("prophet"): each selector row also gets "jaccard_ref", the Jaccard overlap of
  // its recomputed positions with this method's at the same ratio (run untimed when the
  // method is not itself in the plan or its rows were written by an earlier run).
  std::string jaccard_reference;
  // > 0: exactly this many chunks per request (with chunk_tokens, the paper's 20 x 512):
  // passages of the following examples are appended as distractors until there are enough,
  // the rest is cut off. Rows are labelled "<dataset>@<N>tok x<chunks>".
  size_t chunks_per_request = 0;
  // The chunk contexts (kv/chunk_key.h) every method but full runs on (issue 14): rows of
  // prefixed runs carry "chunk_context": "prefixed" (rows written before issue 25:
  // "chunk_variant") and are keyed apart; full runs once.
  std::vector<ChunkContext> chunk_contexts = {ChunkContext::alone};
  // Where full prefill's answer and first-token logits are kept between runs
  // (reference_cache.h); empty: not kept, every example prefills its whole prompt again.
  std::string reference_cache_dir;
};

// The bench's defaults: Cache-Craft without online variant creation (Cache-Craft's own
// chunk-cache variants, §3.3), because a variant that
// one run of an example creates (from that exact prompt's full pass) would be found by the
// same example's later runs at other ratios: an exact match no real request would have.
nlohmann::json bench_default_method_options(const std::string& method);

// One (method, ratio) of the plan.
struct BenchRun {
  std::string method;
  double ratio = 0;
  bool ttft_budget = false;  // auto only: ratio holds a first-token budget in ms, not a quality target
  ChunkContext chunk_context = ChunkContext::alone;  // set by the runner per configured chunk context
};
// full -> (full, 1) and reuse -> (reuse, 0) once; every other method once per ratio.
// Throws std::invalid_argument on an unknown method, a ratio outside [0, 1], or an empty plan.
// Names in `method_presets` are accepted as methods too (see BenchConfig::method_presets).
// "auto" (fusion/auto_quality.h) runs once per quality target in `qualities`, each in (0, 1],
// then once per first-token budget in `ttft_budgets` (ms, > 0; fusion.ttft_ms alone, issue 60):
// its BenchRun::ratio and its rows' "ratio" hold the target or the budget (the key of a row,
// with BenchRun::ttft_budget telling them apart; rows say "quality" or "ttft_budget_ms"), the
// ratio it chose is in the row's "auto". It needs at least one of the two.
std::vector<BenchRun> expand_runs(const std::vector<std::string>& methods, const std::vector<double>& ratios,
                                  const nlohmann::json& method_presets = nlohmann::json::object(),
                                  const std::vector<double>& qualities = {},
                                  const std::vector<double>& ttft_budgets = {});
// Checks a method presets object ({name: {"method": selector, "options": {...}}}); throws
// std::invalid_argument naming the bad entry (unknown method, bad option: the selector's own
// configure() judges them).
void check_method_presets(const nlohmann::json& method_presets);
// The issue-16 ablation of QCFuse as method presets: anchor ratio 1 / 0.1 with all or the critical
// layers, single layers (floor(L/2), profiled top-1, last), and each paper option off
// (probe rows, per-layer anchors, sinks, profile target), plus ProphetKV with all suffix
// rows; every name starts with "qcfuse:" or "prophet:".
nlohmann::json qcfuse_ablation_presets();

struct BenchSummary {
  std::string results_path;
  size_t examples = 0;          // examples in the plan (after --from, --limit and --shard)
  size_t examples_run = 0;      // examples that had rows left to do
  size_t examples_skipped = 0;  // too long for the model's context
  size_t rows_written = 0, rows_already_present = 0;
  size_t references_reused = 0;  // examples scored against a cached reference (no full prefill)
  double seconds = 0;
};

// Rows already in a results file, keyed as the runner keys them. Cuts a half-written last
// line off the file. Missing file: empty.
std::vector<nlohmann::json> read_results(const std::string& path);
// One results.jsonl line (no newline). A generated answer can end inside a UTF-8 character
// (the token limit cut it, or the model emitted a lone byte token); such bytes are written as
// U+FFFD instead of failing the run. The metrics were computed on the raw bytes before.
std::string results_line(const nlohmann::json& row);
// Rows of alone runs (and full) keep the key they had before chunk contexts existed; auto's
// budget rows (ttft_budget) are keyed apart from its quality rows of the same number.
std::string row_key(const std::string& dataset, uint64_t model_fingerprint, const std::string& example_id,
                    const std::string& method, double ratio, ChunkContext chunk_context = ChunkContext::alone,
                    bool ttft_budget = false);
// The dataset name the rows carry: the dataset's own, or "<name>@<N>tok" when re-chunked.
std::string dataset_label(const std::string& dataset_name, size_t chunk_tokens, size_t chunks_per_request = 0);
// Jaccard overlap |a & b| / |a | b| of two ascending position lists (1 when both are empty).
double jaccard(const std::vector<size_t>& a, const std::vector<size_t>& b);

class BenchRunner {
 public:
  BenchRunner(Forward& fwd, BenchConfig cfg);
  BenchSummary run(const Dataset& dataset);

 private:
  Forward& fwd_;
  BenchConfig cfg_;
};

// Runs tools/bench_report.py on `out_dir` with python3. Returns its exit status, or -1 when
// python3 or the script cannot be found; `how_to` then says how to run it by hand.
int run_report(const std::string& out_dir, std::string& how_to);
// Runs <repo>/`relative_script` OUT_DIR with `python` (empty: <repo>/.venv/bin/python, else
// python3); same return convention as run_report.
int run_tool_script(const std::string& relative_script, const std::string& out_dir, std::string& how_to,
                    const std::string& python = "");

// Runs bench/llamacpp_peer.py on `out_dir` (reads prompts.jsonl, appends peer.jsonl) with
// `python` (empty: <repo>/.venv/bin/python), the same GGUF and thread count. Returns its
// exit status, or -1 when the script or the interpreter cannot be found (`how_to` then says
// how to run it by hand).
int run_peer(const std::string& out_dir, const std::string& model_path, int threads, const std::string& python,
             std::string& how_to);

}  // namespace cf::eval

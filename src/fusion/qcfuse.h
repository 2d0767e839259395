// QCFuse (arXiv 2606.05875, §3.2-3.5; digest-qcfuse.md): the pieces the selector
// (select_qcfuse.cpp) and the offline critical-layer profiler (critical_layers.cpp) share.
//
//  - Anchors (§3.3.1, Eq. 14): per chunk, the ceil(r_a |c|) positions a KVzip-style
//    repeat-the-context probe attends to most, computed offline from the chunk's own cache.
//  - Anchor-conditioned probe (§3.3.2, Eq. 15-18): the question suffix U runs over S plus the
//    anchors of every chunk, which keep their request positions; U sits at its request
//    positions after the full context. Its queries at chosen layers are scored against the
//    stitched cache's FULL keys, so every context position gets a score.
//  - Critical layers (§3.4, Eq. 19-20): the profile that says which layers to score with,
//    measured once per model by Recall@10% on span-labelled calibration data.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fusion/rag_prompt.h"
#include "kv/chunk_cache.h"
#include "runtime/forward.h"

namespace cf {
class ChunkStore;
}

namespace cf::qcfuse {

inline constexpr double kDefaultAnchorRatio = 0.1;  // the paper's r_a (the artifact uses 0.15)
inline constexpr size_t kForcedAnchors = 4;         // the artifact's n_sink: first chunk tokens always kept
inline constexpr size_t kSinkKeys = 4;              // the artifact's system-prompt sink keys in the KVzip softmax
inline constexpr const char* kRepeatPrompt = "\n\nRepeat the previous context exactly.";
inline constexpr const char* kExtraKey = "qcfuse";   // ChunkCache::extra["qcfuse"]
inline constexpr int kDefaultCriticalLayers = 3;      // L* = L_3 (Implication 3)
inline constexpr double kProfileBudget = 0.1;         // Recall@10% (Eq. 12)

// How anchors are built (§3.3.1, Eq. 14). Defaults: the authors' artifact (digest [C]).
struct AnchorRule {
  bool sinks = true;      // the first kSinkKeys tokens of a system prefix are keys in the KVzip softmax
  bool per_layer = true;  // one anchor set per layer, ranked by that layer's scores; else one set
                          // per chunk ranked by the sum over all layers
  std::string name() const;  // "sink" / "plain" (+ the layer mode is a field of the stored entry)
};

// Which rows of U are the probe's queries (§3.3.2 [C]) and how much of U is run.
enum class ProbeRows {
  question,  // the question's tokens score; "Question: " is keys only; the template tail is not run
  suffix,    // every row of U scores (question and chat-template tail)
};
bool parse_probe_rows(const std::string& s, ProbeRows& out);
const char* probe_rows_name(ProbeRows r);
// The rows [begin, end) of request.suffix that score under `rows`; U is run up to `end`.
std::pair<size_t, size_t> probe_row_range(const RagRequest& request, ProbeRows rows);

// ceil(ratio * n), at most n.
size_t anchor_count(size_t n, double ratio);

// All positions in anchor order: the first `forced`, then by descending score (ties: lower
// position first).
std::vector<uint32_t> anchor_order(const std::vector<double>& score, size_t forced = kForcedAnchors);
// The ranking of Eq. 14 as the artifact does it: the first `forced` positions come first,
// the rest by descending score (ties: lower position first); keep anchor_count(n, ratio)
// of them and return them ascending.
std::vector<uint32_t> rank_anchors(const std::vector<double>& score, double ratio, size_t forced = kForcedAnchors);

// KVzip-style scores of every entry of a chunk cache (entries in token order at consecutive
// positions), per layer: the repeat prompt runs after the chunk's cached K/V (the chunk is
// not recomputed); `sinks` (nullable) are extra keys before it at their own positions (the
// artifact's system-prompt sinks); each entry scores, per layer, the max over heads and
// prompt tokens of the attention it receives. [layer][entry].
std::vector<std::vector<double>> kvzip_layer_scores(Forward& fwd, const KvCache& chunk_kv, const KvCache* sinks);
// The sum over layers of kvzip_layer_scores without sinks.
std::vector<double> kvzip_scores(Forward& fwd, const KvCache& chunk_kv);
// The sink keys of `rule`: the first kSinkKeys tokens of the model's default RAG system
// prefix, computed exactly at positions 0.. (once per model); nullptr when !rule.sinks.
const KvCache* sink_keys(Forward& fwd, const AnchorRule& rule);

// Computes the anchor rankings of `chunk` under rule.sinks and stores them in
// chunk.extra["qcfuse"][rule.name()] = {"layers": [ranking per layer], "sum": ranking,
// "ms"}: both layer modes, every ratio (a ranking is all positions in anchor order).
void prepare_anchors(Forward& fwd, ChunkCache& chunk, const AnchorRule& rule = {});
// The anchors at `ratio` from the stored rankings (sorted): of `layer` when rule.per_layer,
// else the summed ranking; nullopt when missing or damaged.
std::optional<std::vector<uint32_t>> stored_anchors(const ChunkCache& chunk, double ratio, const AnchorRule& rule = {},
                                                    int layer = 0);
// Whether a chunk's metadata (ChunkCache::extra) holds anchor rankings of any rule (the web
// app's cache state).
bool has_stored_anchors(const nlohmann::json& extra);

// What the probe's U attends to besides S: the full stitched context (ProphetKV's full view,
// Eq. 9), or anchors (Eq. 15-17): slots of the stitched cache, ascending, one set for all
// layers (anchors.size() == 1) or one per layer 0.. (at least up to the deepest scored layer).
struct ProbeView {
  bool full = false;
  std::vector<std::vector<size_t>> anchors;
};

struct ProbeResult {
  std::vector<std::vector<double>> scores;  // per requested layer: score of each context slot
  size_t anchor_entries = 0;                // distinct anchors in the compact cache (S not counted)
  double probe_ms = 0;                      // compact cache + forward pass of U
  double score_ms = 0;                      // scoring against the full keys (inside the pass)
};

// The query probe shared by ProphetKV (full view) and QCFuse (anchor view). `stitched` holds
// S at slots [0, context_begin) and the context at [context_begin, context_end), slot ==
// position. U[0, rows_end) runs over S + the view (anchors keep their positions, U sits
// after the full context) up to the deepest of `layers`; at each requested layer the
// queries of rows [rows_begin, rows_end) are scored against the stitched keys of S + context
// plus U's own (causal): the softmax denominator covers all of them, as the artifact's
// kernel does. Scores are sums over heads and rows, added in a fixed order (deterministic).
// `stitched` is left as it was (a full-view probe appends U and removes it again).
ProbeResult query_probe(Forward& fwd, KvCache& stitched, size_t context_begin, size_t context_end, const ProbeView& view,
                        std::span<const TokenId> suffix, size_t rows_begin, size_t rows_end,
                        const std::vector<int>& layers);

// Sum of a probe's per-layer scores in the order of its layers (Eq. 10 / Eq. 20).
std::vector<double> sum_layers(const ProbeResult& r);

// The anchor sets of one chunk (chunk-local positions, ascending): one set (rule.per_layer
// false) or one per layer 0..n_layers-1, from the stored rankings, else computed now
// (*computed_online = true then; the stored cache is not changed).
std::vector<std::vector<uint32_t>> chunk_anchor_sets(Forward& fwd, const ChunkCache& chunk, double ratio,
                                                     const AnchorRule& rule, int n_layers, bool* computed_online);

// ---- critical-layer profile ----

struct LayerProfile {
  std::string model_fingerprint;            // hex, Model::fingerprint_hex()
  std::vector<double> recall;               // Recall@10% of each layer alone (R(l), Eq. 18)
  std::vector<int> critical_layers;         // top-k layers by R(l), best first (Eq. 19)
  double critical_set_recall = 0;           // Recall@10% of the summed critical layers (Eq. 20)
  double all_layers_recall = 0;             // the all-layer reference
  double anchor_ratio = kDefaultAnchorRatio;
  std::string target = "evidence";          // what Recall@10% is measured against: "evidence" or "prophet"
  double seconds = 0;                       // time the profiling took
  nlohmann::json data = nlohmann::json::object();  // datasets, examples, per-dataset recalls
};

std::string default_profile_path(const std::string& model_fingerprint_hex);  // cache_root()/profiles/<fp>.qcfuse.json
nlohmann::json profile_to_json(const LayerProfile& p);
LayerProfile profile_from_json(const nlohmann::json& j);  // throws std::runtime_error on a malformed profile
void save_profile(const LayerProfile& p, const std::string& path);  // atomic (temp file + rename)
// nullopt when the file does not exist; throws std::runtime_error when it is unreadable.
std::optional<LayerProfile> load_profile(const std::string& path);
// The profile shipped with the project for this model (data/qcfuse_profiles, compiled in):
// <fingerprint>.qcfuse.json (the default, the one that measured best) or, with a `target`,
// <fingerprint>.<target>.qcfuse.json; nullopt when there is none; `source` gets its
// repository path. A shipped file naming another model throws.
std::optional<LayerProfile> bundled_profile(const std::string& model_fingerprint_hex, std::string* source = nullptr,
                                            const std::string& target = "");
// Throws std::runtime_error unless `p` was made for the model `fingerprint_hex` (a profile of
// another model would name layers that mean nothing here).
void check_profile_model(const LayerProfile& p, const std::string& fingerprint_hex, const std::string& where);

// One span-labelled calibration example: passages, question, and the gold evidence as byte
// spans [begin, end) of each passage's chunk text (passage_text(p, RagPromptOptions{})).
struct CalibrationExample {
  std::string dataset;
  size_t index = 0;  // line in its file
  std::vector<Passage> passages;
  std::string question;
  std::vector<std::vector<std::pair<size_t, size_t>>> gold_spans;  // per passage
};

// Natural Questions (lost-in-the-middle oracle file, gzip JSON Lines): the last `limit`
// examples whose answer occurs in the gold passage; the gold spans are the answer's
// occurrences there; the other passages are the gold passages of other chosen examples
// (up to 9), and the gold passage's place varies with the example.
std::vector<CalibrationExample> read_nq_calibration(const std::string& path, size_t limit);
// HotpotQA (distractor setting, JSON Lines): the last `limit` examples; gold spans are the
// supporting-fact sentences.
std::vector<CalibrationExample> read_hotpot_calibration(const std::string& path, size_t limit);
// Any QA example (profile-layers --data): gold spans are the answers' occurrences in each
// passage (exact, else case-insensitive), as for NQ. With the prophet target no labels are
// read, so this fits a profile on the prompts a deployment serves (e.g. musique_s's ~6K tokens).
CalibrationExample answer_span_calibration(std::string dataset, size_t index, std::vector<Passage> passages,
                                           std::string question, const std::vector<std::string>& answers);

// What a layer's top-10% set is judged against (§3.2.3 Eq. 13 / §3.4.1): the gold evidence
// tokens, or the full-view selector's own top-10% set (ProphetKV, all layers, the same probe
// rows; needs no labels, §3.2.2's single-layer agreement).
enum class ProfileTarget { evidence, prophet };

// Which layers may become critical. §3.4 ranks every layer (its models have no local
// ones). On a model with sliding-window layers the calibration prompts (~1.4K tokens) fit
// the window, but a served prompt need not: there a local layer's probe sees only the last
// `window` positions before the question, so it ranks well offline and badly when served
// (measured on Gemma 3, docs/benchmarks-history.md). `global` keeps local layers out; `automatic` is
// `global` on a model with local layers and `all` otherwise.
enum class LayerCandidates { automatic, all, global };
LayerCandidates parse_layer_candidates(const std::string& name);  // throws on an unknown name
// The layers `c` allows on a model with these hparams, ascending (every layer when `global`
// would leave none).
std::vector<int> candidate_layers(LayerCandidates c, const ModelHparams& h);
// The single layer QCFuse falls back to without a profile: floor(L/2) (§4.6.2), or on a model
// with sliding-window layers the global layer nearest to it (the lower one on a tie).
int fallback_critical_layer(const ModelHparams& h);

struct ProfileOptions {
  double anchor_ratio = kDefaultAnchorRatio;
  AnchorRule anchor_rule;
  ProbeRows probe_rows = ProbeRows::question;
  ProfileTarget target = ProfileTarget::evidence;
  int critical_layers = kDefaultCriticalLayers;
  LayerCandidates candidates = LayerCandidates::automatic;
  // Called after each example: done, total, the example, its context tokens.
  std::function<void(size_t, size_t, const CalibrationExample&, size_t)> progress;
};

// Profiles every layer on the examples (PIC caches and anchors come from / go to `store`).
// Examples whose gold spans map to no token are skipped (counted in data.skipped).
LayerProfile profile_critical_layers(Forward& fwd, ChunkStore& store, const std::vector<CalibrationExample>& examples,
                                     const ProfileOptions& opt = {});

// Gold token positions of one passage's tokens: token t is gold if its bytes overlap a span.
// Returns false when the tokens do not spell the text (then `gold` is left empty).
bool gold_token_positions(const Tokenizer& tok, std::span<const TokenId> tokens, const std::string& text,
                          const std::vector<std::pair<size_t, size_t>>& spans, std::vector<size_t>& gold);

}  // namespace cf::qcfuse

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
inline constexpr const char* kRepeatPrompt = "\n\nRepeat the previous context exactly.";
inline constexpr const char* kExtraKey = "qcfuse";   // ChunkCache::extra["qcfuse"]
inline constexpr int kDefaultCriticalLayers = 3;      // L* = L_3 (Implication 3)
inline constexpr double kProfileBudget = 0.1;         // Recall@10% (Eq. 12)

// ceil(ratio * n), at most n.
size_t anchor_count(size_t n, double ratio);

// All positions in anchor order: the first `forced`, then by descending score (ties: lower
// position first).
std::vector<uint32_t> anchor_order(const std::vector<double>& score, size_t forced = kForcedAnchors);
// The ranking of Eq. 14 as the artifact does it: the first `forced` positions come first,
// the rest by descending score (ties: lower position first); keep anchor_count(n, ratio)
// of them and return them ascending.
std::vector<uint32_t> rank_anchors(const std::vector<double>& score, double ratio, size_t forced = kForcedAnchors);

// KVzip-style score of every entry of a chunk cache (entries in token order at consecutive
// positions): the repeat prompt runs after the chunk's cached K/V (the chunk is not
// recomputed), and each entry scores the sum over layers of the max over heads and prompt
// tokens of the attention it receives.
std::vector<double> kvzip_scores(Forward& fwd, const KvCache& chunk_kv);

// Computes the anchor ranking of `chunk` and stores it in chunk.extra["qcfuse"]
// ({"ranking": all positions in anchor order, "anchors": those at `ratio`, "ratio", "rule", "ms"}).
void prepare_anchors(Forward& fwd, ChunkCache& chunk, double ratio = kDefaultAnchorRatio);
// The anchors at `ratio` from the stored ranking (sorted), else nullopt.
std::optional<std::vector<uint32_t>> stored_anchors(const ChunkCache& chunk, double ratio = kDefaultAnchorRatio);

struct ProbeResult {
  std::vector<std::vector<double>> scores;  // per requested layer: score of each context slot
  size_t anchor_entries = 0;                // anchors in the compact cache (S not counted)
  double probe_ms = 0;                      // compact cache + forward pass of U
  double score_ms = 0;                      // scoring against the full keys (inside the pass)
};

// The anchor-conditioned probe. `stitched` holds S at slots [0, context_begin) and the
// context at [context_begin, context_end), slot == position; `anchor_slots` are slots of it
// (ascending). U runs over a scratch cache (S + anchors, copied at their positions) up to
// the deepest of `layers`; at each requested layer every U token's query is scored against
// the stitched keys of S + context plus U's own keys (causal): the softmax denominator
// covers all of them, as the artifact's kernel does. Scores are sums over heads and U
// tokens. `stitched` is not changed.
ProbeResult anchor_probe(Forward& fwd, const KvCache& stitched, size_t context_begin, size_t context_end,
                         std::span<const size_t> anchor_slots, std::span<const TokenId> suffix,
                         const std::vector<int>& layers);

// ---- critical-layer profile ----

struct LayerProfile {
  std::string model_fingerprint;            // hex, Model::fingerprint_hex()
  std::vector<double> recall;               // Recall@10% of each layer alone (R(l), Eq. 18)
  std::vector<int> critical_layers;         // top-k layers by R(l), best first (Eq. 19)
  double critical_set_recall = 0;           // Recall@10% of the summed critical layers (Eq. 20)
  double all_layers_recall = 0;             // the all-layer reference
  double anchor_ratio = kDefaultAnchorRatio;
  double seconds = 0;                       // time the profiling took
  nlohmann::json data = nlohmann::json::object();  // datasets, examples, per-dataset recalls
};

std::string default_profile_path(const std::string& model_fingerprint_hex);  // cache_root()/profiles/<fp>.qcfuse.json
nlohmann::json profile_to_json(const LayerProfile& p);
LayerProfile profile_from_json(const nlohmann::json& j);  // throws std::runtime_error on a malformed profile
void save_profile(const LayerProfile& p, const std::string& path);  // atomic (temp file + rename)
// nullopt when the file does not exist; throws std::runtime_error when it is unreadable.
std::optional<LayerProfile> load_profile(const std::string& path);
// The profile shipped with the project for this model (data/qcfuse_profiles, compiled in),
// nullopt when there is none; `source` gets its repository path.
std::optional<LayerProfile> bundled_profile(const std::string& model_fingerprint_hex, std::string* source = nullptr);

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

struct ProfileOptions {
  double anchor_ratio = kDefaultAnchorRatio;
  int critical_layers = kDefaultCriticalLayers;
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

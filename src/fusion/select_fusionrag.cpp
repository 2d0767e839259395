// FusionRAG (Wang, Xie et al., SIGMOD 2026; fusionrag-paper.txt §3, digest-fusionrag.md).
//  Offline (§3.1, eq. 10; fusionrag_enrich.h, `chunkfuse chunks enrich`): each chunk's cache
//    is recomputed after [S + the base caches of its top-n similar chunks], n = 10; only the
//    chunk's rows are stored, as a `neighbours` variant linked from the chunk's base entry.
//    The paper's base caches are eq. 5's, computed after S: run the request with chunk
//    variant `prefixed` (FusionOptions::chunk_context, bench --chunk-variants, serve
//    --chunk-variant) and enrich with the same variant. With `alone` the neighbours and the
//    fallback caches are PIC caches (this engine's earlier reading, kept for comparison).
//  Online (§3.2): lookup_chunk() serves the enriched variant (the base cache when there is
//    none, noted in the details). select() computes the final-layer query matrix of the
//    question, multiplies it with every chunk's final-layer keys (the stitched cache, keys at
//    their request positions), sums each column over the question rows and heads (the
//    "critical score") and recomputes the global top floor(rho N), no per-chunk quota; then
//    the executor's sparse prefill (eq. 9) recomputes them and the question in all layers.
// Options (Selector::configure, {"fusionrag": {...}}), the paper's reading first:
//  - probe: "question" (default): "a prefill operation is performed on the question to
//    generate the query matrix of the final layer" -- the question prefilled after S only
//    (S is the exact prefix every request has), at its request positions; its final-layer
//    queries are then multiplied with the chunks' final-layer keys.
//    "stitched": the question runs over the whole stitched cache up to the final layer (the
//    digest's open question Q1, context-aware reading; this engine's earlier default).
//  - sink: "none" (default): the enriched rows exactly as eq. 10 computes them.
//    "alone": the enriched cache's first row is replaced by the chunk's first token computed
//    alone at position 0 (moved to its place) -- the attention sink every alone cache has
//    and eq. 10's caches lack. Not in the paper; it answers issue 14's sink question.
//  - enriched_layers: [a, b] (default: every layer): a diagnostic, not the method. Layers
//    outside [a, b) serve the base cache's rows instead of the enriched ones (moved to the
//    same positions), so a bench run shows which layers' enrichment helps or hurts the
//    answer (issue 14: "where the gain is lost").
// Deviations from the paper:
//  - similarity is BM25 over lowercase words (bm25.h), not BGE-M3 embeddings; self and
//    exact duplicates are excluded, and a chunk sharing no word with another gets fewer
//    than n neighbours (none: not enriched);
//  - the score: the paper multiplies the query and key matrices and calls the result
//    "attention weights" without giving the normalisation. We take, for each question row
//    and query head, the softmax of q.k * scale over the retrieved context (probe
//    "question": over the context columns only; "stitched": over everything the row sees),
//    one softmax across all chunks, never per chunk (that would favour short chunks), and
//    sum over rows and all query heads (GQA: a query head reads its group's K);
//  - on sliding-window models the question probe ignores the window (the final layer of
//    Gemma 3 is a global one, so this only matters for other layouts);
//  - the sparse prefill is the shared executor's (recomputed rows overwrite their own slots
//    of the request's private cache; no exclusive pages), same semantics as eq. 9.
// The question is thus processed twice (probe, then with the recomputed rows); both count
// in TTFT (probe as selection).
#include <cmath>
#include <cstring>
#include <utility>

#include "fusion/fusionrag_enrich.h"
#include "fusion/selector.h"
#include "fusion/top_k.h"

namespace cf {
namespace {

enum class Probe { question, stitched };
enum class Sink { none, alone };

// A copy of `enriched` whose first row is the chunk's first token computed alone at
// position 0 (the row an alone cache starts with), moved to the enriched row's position.
std::shared_ptr<const ChunkCache> with_alone_sink(Forward& fwd, const ChunkCache& enriched) {
  const ModelHparams& h = fwd.model().hparams();
  const TokenId first = enriched.tokens().at(0);
  const int32_t zero = 0;
  KvCache one(h, 1);
  fwd.run(one, {std::span<const TokenId>(&first, 1), std::span<const int32_t>(&zero, 1), {}, {}});
  KvCache moved(h, 1);
  moved.append_from(one, 0, 1, enriched.kv.position(0));
  auto out = std::make_shared<ChunkCache>(enriched);
  const size_t row_bytes = static_cast<size_t>(h.kv_dim()) * KvCache::kValueBytes;
  for (int l = 0; l < h.n_layers; ++l) {
    std::memcpy(out->kv.k_f16(l, 0), moved.k_f16(l, 0), row_bytes);
    std::memcpy(out->kv.v_f16(l, 0), moved.v_f16(l, 0), row_bytes);
  }
  return out;
}

// A copy of `enriched` whose layers outside [first, last) hold the base cache's rows.
std::shared_ptr<const ChunkCache> with_base_layers(const ChunkCache& enriched, const ChunkCache& base, int first,
                                                   int last) {
  const ModelHparams& h = enriched.kv.hparams();
  KvCache moved(h, base.n_tokens());
  moved.append_from(base.kv, 0, base.n_tokens(), enriched.kv.position(0) - base.kv.position(0));
  auto out = std::make_shared<ChunkCache>(enriched);
  const size_t bytes = base.n_tokens() * static_cast<size_t>(h.kv_dim()) * KvCache::kValueBytes;
  for (int l = 0; l < h.n_layers; ++l)
    if (l < first || l >= last) {
      std::memcpy(out->kv.k_f16(l, 0), moved.k_f16(l, 0), bytes);
      std::memcpy(out->kv.v_f16(l, 0), moved.v_f16(l, 0), bytes);
    }
  return out;
}

class FusionRagSelector final : public Selector {
 public:
  std::string_view name() const override { return "fusionrag"; }

  void configure(const nlohmann::json& options) override {
    if (options.is_null()) return;
    if (!options.is_object()) throw std::invalid_argument("fusionrag options must be an object");
    for (const auto& [k, v] : options.items()) {
      const std::string s = v.is_string() ? v.get<std::string>() : "";
      if (k == "enriched_layers") {
        if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
            v[0].get<int>() < 0 || v[1].get<int>() < v[0].get<int>())
          throw std::invalid_argument("fusionrag option 'enriched_layers': expected [first, last) layer numbers");
        layers_ = {v[0].get<int>(), v[1].get<int>()};
      } else if (k == "probe" && (s == "question" || s == "stitched")) {
        probe_ = s == "question" ? Probe::question : Probe::stitched;
      } else if (k == "sink" && (s == "none" || s == "alone")) {
        sink_ = s == "none" ? Sink::none : Sink::alone;
      } else if (k == "probe" || k == "sink") {
        throw std::invalid_argument("fusionrag option '" + k + "': expected " +
                                    (k == "probe" ? "\"question\" or \"stitched\"" : "\"none\" or \"alone\""));
      } else {
        throw std::invalid_argument("unknown fusionrag option '" + k + "' (probe, sink, enriched_layers)");
      }
    }
  }

  std::vector<MethodParam> parameters() const override {
    return {
        {"probe", "string", probe_ == Probe::question ? "question" : "stitched", {"question", "stitched"},
         "the question's queries: prefilled after S only (the paper), or over the stitched cache"},
        {"sink", "string", sink_ == Sink::alone ? "alone" : "none", {"none", "alone"},
         "the enriched cache's first row as computed (none) or the chunk's own first token (alone)"},
        {"enriched_layers", "layers", nullptr, {}, "[first, last): layers served from the enriched cache (default: all)"},
    };
  }

  std::shared_ptr<const ChunkCache> lookup_chunk(Forward& fwd, ChunkStore& store, const ChunkKey& pic_key,
                                                 const RagRequest& request, size_t chunk_index) override {
    std::string why;
    auto enriched = find_enriched(store, pic_key, request.system, &why);
    if (chunk_status_.size() <= chunk_index) chunk_status_.resize(chunk_index + 1);
    chunk_status_[chunk_index] = enriched ? "enriched" : "base: " + why;
    if (enriched && (layers_.first > 0 || layers_.second < fwd.model().hparams().n_layers))
      if (auto base = store.get(pic_key); base && base->n_tokens() == enriched->n_tokens())
        enriched = with_base_layers(*enriched, *base, layers_.first, layers_.second);
    if (enriched && sink_ == Sink::alone && enriched->n_tokens() > 0) {
      enriched = with_alone_sink(fwd, *enriched);
      chunk_status_[chunk_index] = "enriched+sink";
    }
    return enriched;
  }

  Selection select(Forward& fwd, FusionInputs& in) override {
    Selection sel;
    size_t n_enriched = 0;
    for (const auto& c : in.chunks)
      if (c.cache && c.cache->key.context().kind == ContextKind::neighbours) ++n_enriched;
    sel.details["enriched_chunks"] = n_enriched;
    sel.details["base_chunks"] = in.chunks.size() - n_enriched;
    sel.details["chunks"] = chunk_status_;
    sel.details["probe"] = probe_ == Probe::question ? "question" : "stitched";
    sel.details["sink"] = sink_ == Sink::alone ? "alone" : "none";
    if (layers_.first > 0 || layers_.second < fwd.model().hparams().n_layers)
      sel.details["enriched_layers"] = {layers_.first, layers_.second};
    sel.details["score"] = "final-layer softmax attention of the question, summed over its rows and heads";
    const size_t n = in.context_tokens();
    const size_t k = recompute_budget(in.ratio, n);
    if (k == 0 || n == 0) return sel;
    std::vector<double> score = probe_ == Probe::question ? question_scores(fwd, in) : stitched_scores(fwd, in);
    sel.slots = top_k_slots(score, in.context_begin, k);
    sel.scores = std::move(score);
    sel.score_kind = probe_ == Probe::question
                         ? "final-layer attention of the question (prefilled after S) to the chunks' keys, summed"
                         : "final-layer attention of the question, summed over its rows and heads";
    return sel;
  }

 private:
  static std::vector<int32_t> suffix_positions(const FusionInputs& in) {
    std::vector<int32_t> pos(in.suffix_tokens().size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = in.suffix_position(i);
    return pos;
  }

  // The question after S only; its final-layer queries against the chunks' final-layer keys.
  static std::vector<double> question_scores(Forward& fwd, FusionInputs& in) {
    const ModelHparams& h = fwd.model().hparams();
    const int last = h.n_layers - 1;
    const auto suffix = in.suffix_tokens();
    const auto pos = suffix_positions(in);
    KvCache scratch(h, in.context_begin + suffix.size());
    scratch.append_from(in.cache, 0, in.context_begin, 0);
    std::vector<float> q(suffix.size() * static_cast<size_t>(h.q_dim()));
    ForwardHooks probe;
    probe.rows.resize(suffix.size());
    for (size_t i = 0; i < suffix.size(); ++i) probe.rows[i] = i;
    probe.layers = {last};
    probe.stop_after_layer = last;
    probe.on_layer = [&](const LayerTap& t) { std::memcpy(q.data(), t.q, q.size() * sizeof(float)); };
    fwd.run(scratch, {suffix, pos, {}, {}}, &probe);

    const size_t n = in.context_tokens();
    const int hd = h.head_dim, group = h.n_heads / h.n_kv_heads;
    const float scale = h.attn_scale != 0.f ? h.attn_scale : 1.0f / std::sqrt(static_cast<float>(hd));
    std::vector<float> keys(n * static_cast<size_t>(h.kv_dim()));
    in.cache.read_k(last, in.context_begin, n, keys.data());
    std::vector<double> score(n, 0.0), logit(n);
    for (size_t r = 0; r < suffix.size(); ++r)
      for (int head = 0; head < h.n_heads; ++head) {
        const float* qr = q.data() + r * h.q_dim() + static_cast<size_t>(head) * hd;
        const size_t kv_off = static_cast<size_t>(head / group) * hd;
        double top = -INFINITY;
        for (size_t i = 0; i < n; ++i) {
          const float* kr = keys.data() + i * h.kv_dim() + kv_off;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += static_cast<double>(qr[d]) * kr[d];
          logit[i] = dot * scale;
          top = std::max(top, logit[i]);
        }
        double z = 0;
        for (size_t i = 0; i < n; ++i) z += (logit[i] = std::exp(logit[i] - top));
        for (size_t i = 0; i < n; ++i) score[i] += logit[i] / z;
      }
    return score;
  }

  // The question over the whole stitched cache up to the final layer (read-only: its
  // entries are removed, no output head); softmax over everything each row sees.
  static std::vector<double> stitched_scores(Forward& fwd, FusionInputs& in) {
    const auto suffix = in.suffix_tokens();
    const auto pos = suffix_positions(in);
    const int n_heads = fwd.model().hparams().n_heads;
    const int last = fwd.model().hparams().n_layers - 1;
    const size_t n = in.context_tokens();
    std::vector<double> score(n, 0.0);
    ForwardHooks probe;
    probe.rows.resize(suffix.size());
    for (size_t i = 0; i < suffix.size(); ++i) probe.rows[i] = i;
    probe.capture_attention = true;
    probe.layers = {last};
    probe.stop_after_layer = last;  // the output head is not needed
    probe.on_layer = [&](const LayerTap& t) {
      for (size_t r = 0; r < t.rows.size(); ++r)
        for (int h = 0; h < n_heads; ++h) {
          const float* p = t.attn_probs + (r * n_heads + h) * t.n_entries;
          for (size_t i = 0; i < n; ++i) score[i] += p[in.context_begin + i];
        }
    };
    const size_t before = in.cache.size();
    try {
      fwd.run(in.cache, {suffix, pos, {}, {}}, &probe);
    } catch (...) {
      in.cache.truncate(before);
      throw;
    }
    in.cache.truncate(before);
    return score;
  }

  Probe probe_ = Probe::question;
  Sink sink_ = Sink::none;
  std::pair<int, int> layers_ = {0, 1 << 20};  // enriched_layers
  std::vector<std::string> chunk_status_;  // per chunk of this request: how it was served
};
}  // namespace

std::unique_ptr<Selector> make_fusionrag_selector() { return std::make_unique<FusionRagSelector>(); }
}  // namespace cf

// FusionRAG (Wang, Xie et al., SIGMOD 2026; fusionrag-paper.txt §3, digest-fusionrag.md).
//  Offline (§3.1, eq. 10; fusionrag_enrich.h, `chunkfuse chunks enrich`): each chunk's cache
//    is recomputed after [S + the PIC caches of its top-n similar chunks], n = 10; only the
//    chunk's rows are stored, as a `neighbours` variant linked from the chunk's PIC entry.
//  Online (§3.2): lookup_chunk() serves the enriched variant (PIC when there is none, noted
//    in the details). select() runs the question suffix U over the stitched cache up to the
//    final layer (read-only: its entries are removed, no output head), sums the final
//    layer's attention weights of every U row and head on each context token (the "critical
//    score": the column sums of the question x chunk attention matrix) and recomputes the
//    global top floor(rho N), no per-chunk quota.
// Deviations from the paper:
//  - similarity is BM25 over lowercase words (bm25.h), not BGE-M3 embeddings; self and
//    exact duplicates are excluded, and a chunk sharing no word with another gets fewer
//    than n neighbours (none: not enriched);
//  - the neighbours in the offline context are position-independent caches (computed alone
//    from position 0, moved into place by re-rotating keys), not eq. 5's S-prefixed ones:
//    they are the caches this engine reuses online for every method. S itself is in the
//    context, at 0..|S|-1, as in eq. 10;
//  - the score: the paper multiplies the final-layer query and key matrices and calls the
//    result "attention weights" without giving the normalisation. We use the softmax
//    probabilities of each U row over everything it sees (S, all chunks, U before it), i.e.
//    one softmax across all chunks, never per chunk (that would favour short chunks), summed
//    over U rows and all query heads. The probe runs U against the stitched cache (the
//    context-aware reading of the digest's open question Q1), so U's final-layer queries
//    are what the fused prefill itself would produce at rho = 0;
//  - the sparse prefill is the shared executor's (recomputed rows overwrite their own slots
//    of the request's private cache; no exclusive pages), same semantics as eq. 9.
// The question is thus processed twice (probe, then with the recomputed rows); both count
// in TTFT (probe as selection).
#include "fusion/fusionrag_enrich.h"
#include "fusion/selector.h"
#include "fusion/top_k.h"

namespace cf {
namespace {
class FusionRagSelector final : public Selector {
 public:
  std::string_view name() const override { return "fusionrag"; }

  std::shared_ptr<const ChunkCache> lookup_chunk(Forward&, ChunkStore& store, const ChunkKey& pic_key,
                                                 const RagRequest& request, size_t chunk_index) override {
    std::string why;
    auto enriched = find_enriched(store, pic_key, request.system, &why);
    if (chunk_status_.size() <= chunk_index) chunk_status_.resize(chunk_index + 1);
    chunk_status_[chunk_index] = enriched ? "enriched" : "pic: " + why;
    return enriched;
  }

  Selection select(Forward& fwd, FusionInputs& in) override {
    Selection sel;
    size_t n_enriched = 0;
    for (const auto& c : in.chunks)
      if (c.cache && c.cache->key.variant().kind == ContextKind::neighbours) ++n_enriched;
    sel.details["enriched_chunks"] = n_enriched;
    sel.details["pic_chunks"] = in.chunks.size() - n_enriched;
    sel.details["chunks"] = chunk_status_;
    sel.details["score"] = "final-layer softmax attention of the question, summed over its rows and heads";
    const size_t n = in.context_tokens();
    const size_t k = recompute_budget(in.ratio, n);
    if (k == 0 || n == 0) return sel;

    const auto suffix = in.suffix_tokens();
    std::vector<int32_t> pos(suffix.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = in.suffix_position(i);
    const int n_heads = fwd.model().hparams().n_heads;
    const int last = fwd.model().hparams().n_layers - 1;
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
    sel.slots = top_k_slots(score, in.context_begin, k);
    sel.scores = std::move(score);
    sel.score_kind = "final-layer attention of the question, summed over its rows and heads";
    return sel;
  }

 private:
  std::vector<std::string> chunk_status_;  // per chunk of this request: how it was served
};
}  // namespace

std::unique_ptr<Selector> make_fusionrag_selector() { return std::make_unique<FusionRagSelector>(); }
}  // namespace cf

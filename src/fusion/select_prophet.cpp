// ProphetKV-style full-view selection (QCFuse §3.2.1, Eq. 9-11): forward the question over
// the whole stitched cache (read-only: its entries are removed afterwards), sum the
// attention the question's tokens pay to every context position over all heads and all
// layers, and recompute the global top floor(rho N). The quality reference QCFuse is
// measured against; its probe over every layer is what makes it slow.
#include "fusion/selector.h"
#include "fusion/top_k.h"

namespace cf {
namespace {
class ProphetSelector final : public Selector {
 public:
  std::string_view name() const override { return "prophet"; }

  Selection select(Forward& fwd, FusionInputs& in) override {
    const size_t n = in.context_tokens();
    const size_t k = recompute_budget(in.ratio, n);
    Selection sel;
    if (k == 0 || n == 0) return sel;
    const auto suffix = in.suffix_tokens();
    std::vector<int32_t> pos(suffix.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = in.suffix_position(i);
    const int n_heads = fwd.model().hparams().n_heads;
    std::vector<double> score(n, 0.0);
    ForwardHooks probe;
    probe.rows.resize(suffix.size());
    for (size_t i = 0; i < suffix.size(); ++i) probe.rows[i] = i;
    probe.capture_attention = true;
    probe.on_layer = [&](const LayerTap& t) {
      for (size_t r = 0; r < t.rows.size(); ++r)
        for (int h = 0; h < n_heads; ++h) {
          const float* p = t.attn_probs + (r * n_heads + h) * t.n_entries;
          for (size_t i = 0; i < n; ++i) score[i] += p[in.context_begin + i];
        }
    };
    const size_t before = in.cache.size();
    fwd.run(in.cache, {suffix, pos, {}, {}}, &probe);
    in.cache.truncate(before);
    sel.slots = top_k_slots(score, in.context_begin, k);
    sel.scores = std::move(score);
    sel.score_kind = "attention of the question's tokens, summed over all layers and heads";
    return sel;
  }
};
}  // namespace

std::unique_ptr<Selector> make_prophet_selector() { return std::make_unique<ProphetSelector>(); }
}  // namespace cf

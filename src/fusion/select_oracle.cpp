// Postmortem oracle (FusionRAG §2.3, Fig. 3a: "the 15% most critical tokens identified by a
// postmortem oracle"): prefill S c1..cm in full, then recompute the floor(rho N) context tokens
// whose reused K/V deviate most from full prefill's (the KV deviation of FusionRAG eq. 7).
// An analysis method, not a serving one: it runs the full prefill it is meant to avoid, so its
// TTFT is above full prefill's. What it measures is how far a selection ranked by the true
// deviation gets at a given ratio, i.e. whether a missed quality target is lost to a selector's
// estimate of the deviation or to the budget itself.
// Deviations from the paper's figure:
//  - eq. 7 is per layer (the paper plots layer 2); the oracle ranks by all layers, K and V, each
//    layer's squared deviation divided by that layer's mean squared full-prefill K/V norm over
//    the context, so that every layer weighs by its relative deviation, not by the scale of its
//    activations (a layer whose deviation is rounding only, as layer 0's, weighs next to nothing).
#include <cmath>

#include "fusion/selector.h"
#include "fusion/top_k.h"

namespace cf {
namespace {
class OracleSelector final : public Selector {
 public:
  std::string_view name() const override { return "oracle"; }

  Selection select(Forward& fwd, FusionInputs& in) override {
    const size_t n = in.context_tokens();
    const size_t k = recompute_budget(in.ratio, n);
    Selection sel;
    if (k == 0 || n == 0) return sel;
    const size_t end = in.context_end;
    KvCache full(in.cache.hparams(), end);
    std::vector<int32_t> pos(end);
    for (size_t i = 0; i < end; ++i) pos[i] = static_cast<int32_t>(i);
    fwd.run(full, {std::span<const TokenId>(in.tokens).first(end), pos, {}, {}});

    const size_t kvd = static_cast<size_t>(in.cache.kv_dim());
    std::vector<float> reused(n * kvd), fresh(n * kvd);
    std::vector<double> score(n, 0.0), layer_dev(n);
    for (int l = 0; l < in.cache.n_layers(); ++l) {
      std::fill(layer_dev.begin(), layer_dev.end(), 0.0);
      double norm2 = 0;
      for (int kv = 0; kv < 2; ++kv) {
        if (kv == 0) {
          in.cache.read_k(l, in.context_begin, n, reused.data());
          full.read_k(l, in.context_begin, n, fresh.data());
        } else {
          in.cache.read_v(l, in.context_begin, n, reused.data());
          full.read_v(l, in.context_begin, n, fresh.data());
        }
        for (size_t i = 0; i < n; ++i)
          for (size_t j = 0; j < kvd; ++j) {
            const double f = fresh[i * kvd + j], d = f - reused[i * kvd + j];
            layer_dev[i] += d * d;
            norm2 += f * f;
          }
      }
      const double mean_norm2 = norm2 / static_cast<double>(n);
      if (mean_norm2 > 0)
        for (size_t i = 0; i < n; ++i) score[i] += layer_dev[i] / mean_norm2;
    }
    sel.slots = top_k_slots(score, in.context_begin, k);
    sel.scores = std::move(score);
    sel.score_kind = "K/V deviation from full prefill, every layer, relative to the layer's K/V norm";
    sel.details["analysis_only"] = true;  // it runs full prefill: its TTFT is not a fused one
    return sel;
  }
};
}  // namespace

std::unique_ptr<Selector> make_oracle_selector() { return std::make_unique<OracleSelector>(); }
}  // namespace cf

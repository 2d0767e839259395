// CacheBlend (Yao et al., EuroSys'25; FusionRAG §2.3 eq. 8-9; QCFuse Table 2): compute every
// context token fresh for the first layers, compare the fresh keys (after RoPE) with the
// reused ones at a check layer, and recompute the floor(rho N) tokens that deviate most.
// Deviations from the original:
//  - one check layer (default 1, as the demo paper's "first-layer KV deviations"), not
//    CacheBlend's gradual layer-by-layer filtering;
//  - the fresh K/V of layers 0..check stay in the cache for all tokens (CacheBlend keeps
//    them too); the selected rows are then recomputed from the embedding again, which
//    repeats check+1 layers for rho N rows (counted in the recompute time).
#include "fusion/selector.h"
#include "fusion/top_k.h"

namespace cf {
namespace {
class CacheBlendSelector final : public Selector {
 public:
  explicit CacheBlendSelector(int check_layer = 1) : check_layer_(check_layer) {}
  std::string_view name() const override { return "cacheblend"; }

  Selection select(Forward& fwd, FusionInputs& in) override {
    const size_t n = in.context_tokens();
    const size_t k = recompute_budget(in.ratio, n);
    Selection sel;
    sel.details["check_layer"] = check_layer_;
    if (k == 0 || n == 0) return sel;
    const int layer = std::min(check_layer_, in.cache.n_layers() - 1);
    const int kvd = in.cache.kv_dim();
    std::vector<float> old_k(n * kvd), fresh_k(n * kvd);
    in.cache.read_k(layer, in.context_begin, n, old_k.data());

    // Fresh pass over all context rows up to the check layer, written into their slots.
    std::vector<TokenId> toks(in.tokens.begin() + in.context_begin, in.tokens.begin() + in.context_end);
    std::vector<int32_t> pos(n);
    std::vector<size_t> slots(n);
    for (size_t i = 0; i < n; ++i) {
      pos[i] = static_cast<int32_t>(in.context_begin + i);
      slots[i] = in.context_begin + i;
    }
    ForwardHooks stop;
    stop.stop_after_layer = layer;
    fwd.run(in.cache, {toks, pos, slots, {}}, &stop);

    in.cache.read_k(layer, in.context_begin, n, fresh_k.data());
    std::vector<double> dev(n);
    for (size_t i = 0; i < n; ++i) {
      const float* fresh = &fresh_k[i * kvd];
      double d = 0;
      for (int j = 0; j < kvd; ++j) {
        const double x = fresh[j] - old_k[i * kvd + j];
        d += x * x;
      }
      dev[i] = d;
    }
    sel.slots = top_k_slots(dev, in.context_begin, k);
    sel.scores = std::move(dev);
    sel.score_kind = "squared deviation of fresh from reused keys at layer " + std::to_string(layer);
    return sel;
  }

 private:
  int check_layer_;
};
}  // namespace

std::unique_ptr<Selector> make_cacheblend_selector() { return std::make_unique<CacheBlendSelector>(); }
}  // namespace cf

// Random selection (the control in QCFuse's demo paper, Fig. 3): floor(rho N) context
// tokens drawn uniformly without replacement, seeded.
#include <algorithm>
#include <numeric>
#include <random>

#include "fusion/selector.h"

namespace cf {
namespace {
class RandomSelector final : public Selector {
 public:
  std::string_view name() const override { return "random"; }
  Selection select(Forward&, FusionInputs& in) override {
    std::vector<size_t> all(in.context_tokens());
    std::iota(all.begin(), all.end(), in.context_begin);
    std::mt19937_64 rng(in.seed);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(recompute_budget(in.ratio, all.size()));
    std::sort(all.begin(), all.end());
    Selection sel{std::move(all), {}, {}, "none: random draws tokens uniformly, it scores nothing"};
    return sel;
  }
};
}  // namespace

std::unique_ptr<Selector> make_random_selector() { return std::make_unique<RandomSelector>(); }
}  // namespace cf

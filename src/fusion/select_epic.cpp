// EPIC (Hu et al. 2024, "LegoLink"; as summarised in QCFuse §4.1.2): recompute the first
// tokens of every stitched chunk, which a chunk computed alone turns into attention sinks.
// Deviation: EPIC fixes a small count per chunk; to compare methods at one budget we give
// each chunk an equal share of floor(rho N) (a chunk shorter than its share passes the
// rest on to the next chunks).
// On prefixed caches (computed after S, issue 14) a chunk's first rows are no sinks; the rule
// is applied unchanged, as the papers define it only for alone caches (docs/benchmarks-history.md: it then
// loses to its alone version).
#include <algorithm>

#include "fusion/selector.h"

namespace cf {
namespace {
class EpicSelector final : public Selector {
 public:
  std::string_view name() const override { return "epic"; }
  Selection select(Forward&, FusionInputs& in) override {
    // Water-filling: equal shares, a chunk shorter than its share gives the rest back.
    std::vector<size_t> take(in.chunks.size(), 0);
    size_t left = recompute_budget(in.ratio, in.context_tokens());
    while (left > 0) {
      size_t open = 0;
      for (size_t i = 0; i < in.chunks.size(); ++i) open += take[i] < in.chunks[i].n_tokens;
      if (open == 0) break;
      const size_t share = std::max<size_t>(1, left / open);
      for (size_t i = 0; i < in.chunks.size() && left > 0; ++i) {
        const size_t more = std::min({share, in.chunks[i].n_tokens - take[i], left});
        take[i] += more;
        left -= more;
      }
    }
    Selection sel;
    for (size_t i = 0; i < in.chunks.size(); ++i)
      for (size_t t = 0; t < take[i]; ++t) sel.slots.push_back(in.chunks[i].begin + t);
    sel.details["per_chunk"] = take;
    // EPIC's rule as a score: a token's worth falls with its place in its chunk.
    for (const ChunkPlacement& c : in.chunks)
      for (size_t t = 0; t < c.n_tokens; ++t) sel.scores.push_back(1.0 / static_cast<double>(t + 1));
    sel.score_kind = "1 / (position in its chunk + 1): EPIC recomputes chunk starts";
    return sel;
  }
};
}  // namespace

std::unique_ptr<Selector> make_epic_selector() { return std::make_unique<EpicSelector>(); }
}  // namespace cf

// Full reuse (rho = 0): stitch the chunks' position-independent caches at consecutive
// request positions and recompute nothing but the question (TurboRAG / Prompt Cache style;
// QCFuse §2.1 "Direct PIC reuse"). The ratio is ignored: this method is defined at 0.
#include "fusion/selector.h"

namespace cf {
namespace {
class ReuseSelector final : public Selector {
 public:
  std::string_view name() const override { return "reuse"; }
  Selection select(Forward&, FusionInputs&) override {
    return {{}, {}, {}, "none: reuse recomputes nothing"};
  }
};
}  // namespace

std::unique_ptr<Selector> make_reuse_selector() { return std::make_unique<ReuseSelector>(); }
}  // namespace cf

// ProphetKV-style full-view selection (QCFuse §3.2.1, Eq. 9-11): forward the question over
// the whole stitched cache (read-only: its entries are removed afterwards), sum the
// attention the question's tokens pay to every context position over all heads and all
// layers, and recompute the global top floor(rho N). The quality reference QCFuse is
// measured against; its probe over every layer is what makes it slow. The probe is
// qcfuse::query_probe with the full view, so QCFuse with anchor_ratio 1 and all layers
// selects exactly the same positions (tests/fusion/test_qcfuse.cpp).
//
// Option (--method-options '{"prophet": {...}}' or fusion.options):
//   probe_rows  "question" (default: the question's tokens score, as in the QCFuse authors'
//               port of the full-view selector; "Question: " is keys only, the chat-template
//               tail is not run) | "suffix" (every row of U scores, question and template tail)
#include "base/bounded_json.h"
#include "fusion/qcfuse.h"
#include "fusion/selector.h"
#include "fusion/top_k.h"

namespace cf {
namespace {
class ProphetSelector final : public Selector {
 public:
  std::string_view name() const override { return "prophet"; }

  void configure(const nlohmann::json& options) override {
    if (options.is_null()) return;
    if (!options.is_object()) throw std::invalid_argument("prophet options must be a JSON object");
    for (const auto& [key, value] : options.items()) {
      if (key != "probe_rows")
        throw std::invalid_argument("prophet has no option '" + key + "' (known: probe_rows)");
      if (!value.is_string() || !qcfuse::parse_probe_rows(value.get<std::string>(), rows_))
        throw std::invalid_argument("prophet option 'probe_rows': must be \"question\" or \"suffix\", got " + json_excerpt(value));
    }
  }

  std::vector<MethodParam> parameters() const override {
    return {{"probe_rows", "string", qcfuse::probe_rows_name(rows_), {"question", "suffix"},
             "which rows of the question suffix probe"}};
  }

  Selection select(Forward& fwd, FusionInputs& in) override {
    const size_t n = in.context_tokens();
    const size_t k = recompute_budget(in.ratio, n);
    Selection sel;
    if (k == 0 || n == 0) return sel;
    std::vector<int> all(static_cast<size_t>(fwd.model().hparams().n_layers));
    for (size_t l = 0; l < all.size(); ++l) all[l] = static_cast<int>(l);
    const auto [rb, re] = qcfuse::probe_row_range(in.request, rows_);
    qcfuse::ProbeView full;
    full.full = true;
    const qcfuse::ProbeResult pr =
        qcfuse::query_probe(fwd, in.cache, in.context_begin, in.context_end, full, in.suffix_tokens(), rb, re, all);
    std::vector<double> score = qcfuse::sum_layers(pr);
    sel.slots = top_k_slots(score, in.context_begin, k);
    sel.scores = std::move(score);
    sel.score_kind = "attention of the probe rows (the question's tokens by default), summed over all layers and heads";
    sel.details["probe_rows"] = re - rb == in.request.suffix.size() ? "suffix" : "question";
    return sel;
  }

 private:
  qcfuse::ProbeRows rows_ = qcfuse::ProbeRows::question;
};
}  // namespace

std::unique_ptr<Selector> make_prophet_selector() { return std::make_unique<ProphetSelector>(); }
}  // namespace cf

#include "fusion/fusion_options.h"

#include <algorithm>
#include <cmath>

#include "fusion/methods.h"

namespace cf {

bool FusionOptions::full() const { return is_full_prefill(method); }
bool FusionOptions::automatic() const { return is_auto_policy(method); }

namespace {

bool has_options(const nlohmann::json& o) { return !o.is_null() && !o.empty(); }

// From the API, a string option with listed values must be one of them (no file paths).
void check_api_values(const Selector& s, const nlohmann::json& options) {
  if (!options.is_object()) return;
  for (const MethodParam& p : s.parameters()) {
    const auto it = options.find(p.name);
    if (it == options.end() || !it->is_string() || p.values.empty()) continue;
    if (std::find(p.values.begin(), p.values.end(), it->get<std::string>()) != p.values.end()) continue;
    std::string known;
    for (const auto& v : p.values) known += (known.empty() ? "" : ", ") + v;
    throw FusionOptionsError("fusion.options",
                             "fusion.options." + p.name + ": only " + known + " over the API");
  }
}

}  // namespace

void validate_fusion_options(const FusionOptions& o, OptionsSource source) {
  if (o.method.empty()) throw FusionOptionsError("fusion.method", "'fusion.method' must not be empty");
  const MethodEntry* e = find_method(o.method);
  if (!e)
    throw FusionOptionsError("fusion.method",
                             "unknown fusion method \"" + o.method + "\" (known: " + known_methods_text() + ")");
  const std::string name(e->name);
  if (o.ttft_ms != 0 && !(o.ttft_ms > 0 && std::isfinite(o.ttft_ms)))
    throw FusionOptionsError("fusion.ttft_ms", "fusion.ttft_ms must be a number of milliseconds > 0");
  if (e->kind != MethodKind::automatic && o.ttft_ms != 0)
    throw FusionOptionsError("fusion.ttft_ms", "fusion.ttft_ms applies to fusion method \"" + auto_method_name() +
                                                   "\" only");
  if (e->kind == MethodKind::automatic && o.quality == 0 && o.ttft_ms > 0) {
    // a budget alone: the best plan that fits it
  } else if (e->kind == MethodKind::automatic) {
    if (!(o.quality > 0 && o.quality <= 1))
      throw FusionOptionsError("fusion.quality", "fusion method '" + name +
                                                     "' needs fusion.quality in (0, 1] (the share of answers "
                                                     "identical to full prefill's) or fusion.ttft_ms > 0");
  } else if (o.quality != 0) {
    throw FusionOptionsError("fusion.quality", "fusion.quality applies to fusion method \"" + auto_method_name() +
                                                   "\" only");
  }
  if (e->kind != MethodKind::selector && has_options(o.method_options))
    throw FusionOptionsError("fusion.options", "fusion method '" + name + "' takes no options");
  if (e->kind == MethodKind::selector) {
    try {  // the method judges its options (an unknown name or a value out of range names the option)
      const auto selector = e->make();
      if (source == OptionsSource::api) check_api_values(*selector, o.method_options);  // before any file is read
      selector->configure(o.method_options);
    } catch (const FusionOptionsError&) {
      throw;
    } catch (const std::invalid_argument& err) {
      throw FusionOptionsError("fusion.options", std::string("fusion.options: ") + err.what());
    }
  }
  if (!(o.ratio >= 0.0 && o.ratio <= 1.0))
    throw FusionOptionsError("fusion.ratio", "fusion.ratio must be in [0, 1], got " + std::to_string(o.ratio));
}

}  // namespace cf

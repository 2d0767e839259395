#include "fusion/selector.h"

#include <cmath>
#include <stdexcept>

namespace cf {

std::unique_ptr<Selector> make_reuse_selector();
std::unique_ptr<Selector> make_random_selector();
std::unique_ptr<Selector> make_epic_selector();
std::unique_ptr<Selector> make_cacheblend_selector();
std::unique_ptr<Selector> make_prophet_selector();
std::unique_ptr<Selector> make_cachecraft_selector();
std::unique_ptr<Selector> make_qcfuse_selector();
std::unique_ptr<Selector> make_fusionrag_selector();
std::unique_ptr<Selector> make_oracle_selector();

namespace {
struct Entry {
  const char* name;
  std::unique_ptr<Selector> (*make)();
};
const Entry kSelectors[] = {
    {"reuse", make_reuse_selector},          {"random", make_random_selector},
    {"epic", make_epic_selector},            {"cacheblend", make_cacheblend_selector},
    {"prophet", make_prophet_selector},
    {"cachecraft", make_cachecraft_selector},
    {"qcfuse", make_qcfuse_selector},
    {"fusionrag", make_fusionrag_selector},
    {"oracle", make_oracle_selector},  // analysis only: runs full prefill (select_oracle.cpp)
};
}  // namespace

size_t recompute_budget(double ratio, size_t n) {
  if (!(ratio >= 0.0 && ratio <= 1.0)) throw std::invalid_argument("ratio must be in [0, 1]");
  return std::min(n, static_cast<size_t>(std::floor(ratio * static_cast<double>(n) + 1e-9)));
}

std::unique_ptr<Selector> make_selector(std::string_view name) {
  for (const auto& e : kSelectors)
    if (name == e.name) return e.make();
  std::string known = "full";
  for (const auto& e : kSelectors) known += std::string(", ") + e.name;
  throw std::invalid_argument("unknown fusion method '" + std::string(name) + "' (known: " + known + ")");
}

nlohmann::json MethodParam::to_json() const {
  nlohmann::json j{{"name", name}, {"type", type}, {"default", default_value}, {"help", help}};
  if (!values.empty()) j["values"] = values;
  return j;
}

nlohmann::json method_catalog() {
  nlohmann::json out = nlohmann::json::array();
  out.push_back({{"id", "full"}, {"parameters", nlohmann::json::array()}});
  for (const auto& e : kSelectors) {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : e.make()->parameters()) params.push_back(p.to_json());
    out.push_back({{"id", e.name}, {"parameters", params}});
  }
  // Quality on demand (auto_quality.h): no options; it takes fusion.quality instead of a ratio.
  out.push_back({{"id", "auto"},
                 {"parameters", nlohmann::json::array()},
                 {"fields", {MethodParam{"quality", "number", 0.9, {},
                                         "share in (0, 1] of answers identical to full prefill's (as calibrated); "
                                         "the policy picks method and ratio per request (fusion.quality, not fusion.ratio)"}
                                 .to_json()}}});
  return out;
}

std::vector<std::string> selector_names() {
  std::vector<std::string> names;
  for (const auto& e : kSelectors) names.push_back(e.name);
  return names;
}

}  // namespace cf

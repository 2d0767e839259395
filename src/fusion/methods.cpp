#include "fusion/methods.h"

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
constexpr MethodEntry kMethods[] = {
    {"full", MethodKind::full, nullptr, 1.0},
    {"reuse", MethodKind::selector, make_reuse_selector, 0.0},
    {"random", MethodKind::selector, make_random_selector, MethodEntry::kTakesRatio},
    {"epic", MethodKind::selector, make_epic_selector, MethodEntry::kTakesRatio},
    {"cacheblend", MethodKind::selector, make_cacheblend_selector, MethodEntry::kTakesRatio},
    {"prophet", MethodKind::selector, make_prophet_selector, MethodEntry::kTakesRatio},
    {"cachecraft", MethodKind::selector, make_cachecraft_selector, MethodEntry::kTakesRatio, false,
     R"({"create_variants": false})"},
    {"qcfuse", MethodKind::selector, make_qcfuse_selector, MethodEntry::kTakesRatio},
    {"fusionrag", MethodKind::selector, make_fusionrag_selector, MethodEntry::kTakesRatio, true},
    {"oracle", MethodKind::selector, make_oracle_selector, MethodEntry::kTakesRatio},  // analysis only: runs full prefill (select_oracle.cpp)
    {"auto", MethodKind::automatic, nullptr, MethodEntry::kTakesRatio},
};

const MethodEntry& first_of(MethodKind kind) {
  for (const auto& e : kMethods)
    if (e.kind == kind) return e;
  throw std::logic_error("method registry lacks a kind");
}
}  // namespace

std::span<const MethodEntry> method_entries() { return kMethods; }

const MethodEntry* find_method(std::string_view name) {
  for (const auto& e : kMethods)
    if (e.name == name) return &e;
  return nullptr;
}

std::string known_methods_text() {
  std::string known;
  for (const auto& e : kMethods) known += (known.empty() ? "" : ", ") + std::string(e.name);
  return known;
}

const MethodEntry& method_entry(std::string_view name) {
  if (const MethodEntry* e = find_method(name)) return *e;
  throw std::invalid_argument("unknown fusion method '" + std::string(name) + "' (known: " + known_methods_text() + ")");
}

bool is_full_prefill(std::string_view name) {
  const MethodEntry* e = find_method(name);
  return e && e->kind == MethodKind::full;
}

bool is_auto_policy(std::string_view name) {
  const MethodEntry* e = find_method(name);
  return e && e->kind == MethodKind::automatic;
}

bool enriches_from_corpus(std::string_view name) {
  const MethodEntry* e = find_method(name);
  return e && e->enriches_from_corpus;
}

std::string full_method_name() { return std::string(first_of(MethodKind::full).name); }
std::string auto_method_name() { return std::string(first_of(MethodKind::automatic).name); }
std::string default_fusion_method_name() { return "epic"; }

const MethodEntry& selector_entry(std::string_view name) {
  const MethodEntry* e = find_method(name);
  if (e && e->kind == MethodKind::selector) return *e;
  std::string known;
  for (const auto& s : selector_names()) known += (known.empty() ? "" : ", ") + s;
  throw std::invalid_argument("unknown selector '" + std::string(name) + "' (known: " + known + ")");
}

std::unique_ptr<Selector> make_selector(std::string_view name) {
  const MethodEntry& e = method_entry(name);  // an unknown name lists every method
  return selector_entry(e.name).make();
}

std::vector<std::string> selector_names() {
  std::vector<std::string> names;
  for (const auto& e : kMethods)
    if (e.kind == MethodKind::selector) names.emplace_back(e.name);
  return names;
}

nlohmann::json method_catalog() {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : kMethods) {
    nlohmann::json params = nlohmann::json::array();
    if (e.kind == MethodKind::selector)
      for (const auto& p : e.make()->parameters()) params.push_back(p.to_json());
    nlohmann::json entry{{"id", e.name}, {"parameters", params}};
    // Quality on demand (auto_quality.h): no options; it takes fusion.quality instead of a ratio.
    if (e.kind == MethodKind::automatic)
      entry["fields"] = {MethodParam{"quality", "number", 0.9, {},
                                     "share in (0, 1] of answers identical to full prefill's (as calibrated); "
                                     "the policy picks method and ratio per request (fusion.quality, not fusion.ratio)"}
                             .to_json(),
                         MethodParam{"ttft_ms", "number", 0, {},
                                     "first-token budget in ms (0: none): the best plan whose predicted time fits it, "
                                     "or with quality the cheapest meeting it within the budget"}
                             .to_json()};
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace cf

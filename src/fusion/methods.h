// The method registry (issue 61): every name a request may give as fusion.method (full
// prefill, the auto policy and each selector of selector.h) is one entry here, with its kind
// and how it is built. Nothing outside this file tests a method's name: callers ask the
// entry's kind (FusionOptions::full(), automatic()) or build the selector from it.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fusion/selector.h"

namespace cf {

enum class MethodKind {
  full,       // plain prefill of the whole request: the reference every method is measured against
  automatic,  // the auto policy (fusion/auto_quality.h): picks a selector and ratio per request
  selector,   // a method of the papers, behind the Selector interface
};

struct MethodEntry {
  std::string_view name;
  MethodKind kind;
  std::unique_ptr<Selector> (*make)();  // kind selector only; else nullptr
  // The share of context tokens it always recomputes (full: 1, reuse: 0), or kTakesRatio: it
  // works at the request's fusion.ratio (auto: at the ratio it picks).
  double fixed_ratio;
  static constexpr double kTakesRatio = -1;
  bool takes_ratio() const { return fixed_ratio < 0; }
  // FusionRAG (§3.2): its offline step enriches each chunk with its neighbours in a corpus, which
  // the bench builds from the dataset (eval/runner.cpp fusionrag_prefill).
  bool enriches_from_corpus = false;
  // The options `chunkfuse bench` runs it with unless told otherwise (JSON): Cache-Craft keeps
  // its stored variants fixed so that rows do not depend on the order they ran in.
  const char* bench_options = "{}";
};

// Every entry, full first, then the selectors in registry order, then auto.
std::span<const MethodEntry> method_entries();
// nullptr: no method has this name.
const MethodEntry* find_method(std::string_view name);
// The entry, or std::invalid_argument "unknown fusion method 'x' (known: ...)".
const MethodEntry& method_entry(std::string_view name);
// Whether `name` is the registry's entry of that kind (false for an unknown name).
bool is_full_prefill(std::string_view name);
bool is_auto_policy(std::string_view name);
bool enriches_from_corpus(std::string_view name);
// Names of the kind; "full, reuse, ..., auto" for messages and help texts.
std::string full_method_name();  // the reference's name, for callers that build options
std::string auto_method_name();
// The fusion method a caller uses when it wants one and names none: `ask`, `serve
// --match-chunks`, the web page on a server whose default is full prefill, scripts/run.sh.
// EPIC, by measurement (issue 60 item 5; BENCHMARKS.md "Which method by default"): on the
// default model at ρ 0.15, held out (musique_s, rgb_en_fact), the best mean fidelity to full
// prefill (0.604 against QCFuse 0.580 and CacheBlend 0.583, intervals overlapping) and the
// fastest TTFT of the three (no selection pass). It was QCFuse, by the papers.
std::string default_fusion_method_name();
std::string known_methods_text();
// The entry of a selector-kind method, or std::invalid_argument naming the selectors.
const MethodEntry& selector_entry(std::string_view name);

// The selector of a selector-kind method (std::invalid_argument on any other name).
std::unique_ptr<Selector> make_selector(std::string_view name);
std::vector<std::string> selector_names();  // registry order
// Every method with its parameters: [{"id", "parameters": [MethodParam::to_json()...]}];
// GET /v1/methods serves it.
nlohmann::json method_catalog();

}  // namespace cf

#include "fusion/auto_quality.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "base/bounded_json.h"
#include "base/clock.h"
#include "base/paths.h"
#include "fusion/bundled_files.h"
#include "fusion/methods.h"
#include "runtime/sampler.h"

namespace cf::autoq {
namespace {

using nlohmann::json;

std::invalid_argument field_error(const std::string& source, const std::string& what) {
  return std::invalid_argument(source + ": " + what);
}

}  // namespace

FirstTokenSignals first_token_signals(std::span<const float> logits) {
  if (logits.empty()) throw std::invalid_argument("auto: empty logits");
  const std::vector<double> lp = log_softmax(logits);
  FirstTokenSignals s;
  s.top1 = argmax(logits.data(), logits.size());
  double second = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    const double p = std::exp(lp[i]);
    if (static_cast<int32_t>(i) != s.top1) second = std::max(second, p);
    if (p > 0) s.entropy -= p * lp[i];
  }
  s.margin = std::exp(lp[s.top1]) - second;
  return s;
}

std::vector<double> predictor_features(const FirstTokenSignals& s) { return {s.margin, s.entropy}; }

double logistic(const std::vector<double>& w, const std::vector<double>& x) {
  if (w.size() != x.size() + 1) throw std::invalid_argument("logistic: weights and features differ in length");
  double z = w[0];
  for (size_t i = 0; i < x.size(); ++i) z += w[i + 1] * x[i];
  return 1.0 / (1.0 + std::exp(-z));
}

// Newton-Raphson on the penalised log-likelihood: the Hessian is d x d (d = features + 1,
// here 3), solved by Gaussian elimination with partial pivoting.
std::vector<double> fit_logistic(const std::vector<std::vector<double>>& x, const std::vector<int>& y, double l2) {
  if (x.size() != y.size() || x.empty()) throw std::invalid_argument("fit_logistic: need as many labels as rows, and some rows");
  const size_t d = x[0].size() + 1;
  for (const auto& row : x)
    if (row.size() + 1 != d) throw std::invalid_argument("fit_logistic: rows of different lengths");
  std::vector<double> w(d, 0.0);
  for (int iter = 0; iter < 50; ++iter) {
    std::vector<double> g(d, 0.0);
    std::vector<std::vector<double>> h(d, std::vector<double>(d, 0.0));
    for (size_t n = 0; n < x.size(); ++n) {
      const double p = logistic(w, x[n]);
      const double r = p - y[n], v = std::max(p * (1 - p), 1e-12);
      for (size_t i = 0; i < d; ++i) {
        const double xi = i == 0 ? 1.0 : x[n][i - 1];
        g[i] += r * xi;
        for (size_t j = 0; j < d; ++j) h[i][j] += v * xi * (j == 0 ? 1.0 : x[n][j - 1]);
      }
    }
    for (size_t i = 1; i < d; ++i) {
      g[i] += l2 * w[i];
      h[i][i] += l2;
    }
    h[0][0] += 1e-9;  // all labels equal: the intercept runs off slowly instead of dividing by 0
    // Solve h * step = g.
    std::vector<double> step = g;
    for (size_t c = 0; c < d; ++c) {
      size_t piv = c;
      for (size_t r = c + 1; r < d; ++r)
        if (std::abs(h[r][c]) > std::abs(h[piv][c])) piv = r;
      std::swap(h[c], h[piv]);
      std::swap(step[c], step[piv]);
      for (size_t r = 0; r < d; ++r) {
        if (r == c || h[c][c] == 0) continue;
        const double f = h[r][c] / h[c][c];
        for (size_t k = c; k < d; ++k) h[r][k] -= f * h[c][k];
        step[r] -= f * step[c];
      }
    }
    double change = 0;
    for (size_t i = 0; i < d; ++i) {
      const double s = h[i][i] != 0 ? step[i] / h[i][i] : 0;
      w[i] -= std::clamp(s, -10.0, 10.0);
      change = std::max(change, std::abs(s));
    }
    if (change < 1e-8) break;
  }
  return w;
}

namespace {
// A JSON integer >= 0 (parsed text gives unsigned, values built in code signed ones); what
// get<size_t>() may convert without undefined behaviour.
bool whole_number(const json& v) { return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0); }

// The format before size classes: one plan ("policies") for every request.
constexpr const char* kCalibrationFormatOneClass = "chunkfuse.auto.calibration/2";

std::vector<AutoPolicy> parse_policies(const json& list, size_t n_steps, const std::string& source) {
  std::vector<AutoPolicy> out;
  auto share = [](double v) { return v >= 0 && v <= 1; };
  for (const auto& p : list) {
    AutoPolicy pol;
    try {
      pol.quality = p.at("quality").get<double>();
      if (!p.at("steps").is_array()) throw field_error(source, "policy steps must be ascending indices of \"steps\"");
      for (const auto& k : p.at("steps")) {
        if (!whole_number(k)) throw field_error(source, "policy steps must be ascending indices of \"steps\"");
        pol.steps.push_back(k.get<size_t>());  // a float would convert with undefined behaviour
      }
      pol.threshold = p.at("threshold").get<double>();
      pol.expected_share = p.value("expected_share", 0.0);
      pol.observed_share = p.value("observed_share", 0.0);
      pol.ttft_share = p.value("ttft_share", 0.0);
    } catch (const json::exception& e) {
      throw field_error(source, std::string("a policy needs quality, steps, threshold: ") + e.what());
    }
    if (!(pol.quality > 0 && pol.quality <= 1)) throw field_error(source, "policy quality must be in (0, 1]");
    if (!out.empty() && !(pol.quality > out.back().quality)) throw field_error(source, "policies must be in ascending quality");
    if (!share(pol.threshold) || !share(pol.expected_share) || !share(pol.observed_share))
      throw field_error(source, "policy threshold and shares must be in [0, 1]");
    if (!(pol.ttft_share >= 0 && std::isfinite(pol.ttft_share))) throw field_error(source, "policy ttft_share must be >= 0");
    for (size_t i = 0; i < pol.steps.size(); ++i)
      if (pol.steps[i] >= n_steps || (i > 0 && pol.steps[i] <= pol.steps[i - 1]))
        throw field_error(source, "policy steps must be ascending indices of \"steps\"");
    out.push_back(std::move(pol));
  }
  return out;
}

json policies_json(const std::vector<AutoPolicy>& policies) {
  json out = json::array();
  for (const auto& p : policies)
    out.push_back({{"quality", p.quality}, {"steps", p.steps}, {"threshold", p.threshold},
                   {"expected_share", p.expected_share}, {"observed_share", p.observed_share},
                   {"ttft_share", p.ttft_share}});
  return out;
}
}  // namespace

AutoCalibration AutoCalibration::parse(const json& j, const std::string& source) {
  if (!j.is_object()) throw field_error(source, "a calibration is a JSON object");
  if (j.value("format", "") == "chunkfuse.auto.calibration/1")
    throw field_error(source, "written by an older chunkfuse (format /1, without policies): refit it from its records "
                              "file with `chunkfuse calibrate --fit RECORDS...` (nothing is rerun)");
  if (j.value("format", "") != kCalibrationFormat && j.value("format", "") != kCalibrationFormatOneClass)
    throw field_error(source, std::string("format must be \"") + kCalibrationFormat + "\" (or /2)");
  AutoCalibration c;
  c.source = source;
  if (!j.contains("fingerprint") || !j["fingerprint"].is_string()) throw field_error(source, "missing \"fingerprint\"");
  c.fingerprint = j["fingerprint"].get<std::string>();
  if (!j.contains("steps") || !j["steps"].is_array() || j["steps"].empty())
    throw field_error(source, "\"steps\" must be a non-empty array");
  for (const auto& s : j["steps"]) {
    AutoStep st;
    try {
      st.method = s.at("method").get<std::string>();
      st.ratio = s.at("ratio").get<double>();
      st.options = s.value("options", json::object());
      st.weights = s.at("weights").get<std::vector<double>>();
    } catch (const json::exception& e) {
      throw field_error(source, std::string("a step needs method, ratio, weights: ") + e.what());
    }
    if (st.weights.size() != kFeatureCount + 1)
      throw field_error(source, "step weights must have " + std::to_string(kFeatureCount + 1) + " numbers");
    if (!(st.ratio >= 0 && st.ratio <= 1)) throw field_error(source, "step ratio must be in [0, 1]");
    for (double w : st.weights)
      if (!std::isfinite(w)) throw field_error(source, "step weights must be finite");
    c.steps.push_back(std::move(st));
  }
  if (j["format"] == kCalibrationFormatOneClass) {  // /2: one plan for every request size
    if (!j.contains("policies") || !j["policies"].is_array()) throw field_error(source, "\"policies\" must be an array");
    c.size_classes.push_back({0, 0, parse_policies(j["policies"], c.steps.size(), source)});
  } else {
    if (!j.contains("size_classes") || !j["size_classes"].is_array() || j["size_classes"].empty())
      throw field_error(source, "\"size_classes\" must be a non-empty array");
    for (const auto& k : j["size_classes"]) {
      SizeClass sc;
      try {
        const json& bound = k.at("min_context_tokens");
        const json& examples = k.value("examples", json(0));
        if (!whole_number(bound) || !whole_number(examples))
          throw field_error(source, "a size class needs min_context_tokens (and examples) as whole numbers >= 0");
        sc.min_context_tokens = bound.get<size_t>();
        sc.examples = examples.get<size_t>();
      } catch (const json::exception& e) {
        throw field_error(source, std::string("a size class needs min_context_tokens: ") + e.what());
      }
      if (c.size_classes.empty() ? sc.min_context_tokens != 0 : sc.min_context_tokens <= c.size_classes.back().min_context_tokens)
        throw field_error(source, "size classes must start at 0 context tokens and ascend");
      if (!k.contains("policies") || !k["policies"].is_array()) throw field_error(source, "a size class's \"policies\" must be an array");
      sc.policies = parse_policies(k["policies"], c.steps.size(), source);
      c.size_classes.push_back(std::move(sc));
    }
  }
  c.provenance = j.value("provenance", json::object());
  return c;
}

json AutoCalibration::to_json() const {
  json steps_out = json::array(), classes_out = json::array();
  for (const auto& s : steps)
    steps_out.push_back({{"method", s.method}, {"ratio", s.ratio}, {"options", s.options}, {"weights", s.weights}});
  for (const auto& k : size_classes)
    classes_out.push_back({{"min_context_tokens", k.min_context_tokens}, {"examples", k.examples}, {"policies", policies_json(k.policies)}});
  return {{"format", kCalibrationFormat},
          {"fingerprint", fingerprint},
          {"features", {"margin", "entropy"}},
          {"steps", steps_out},
          {"size_classes", classes_out},
          {"provenance", provenance}};
}

double AutoCalibration::predict(size_t step, const FirstTokenSignals& s) const {
  return logistic(steps.at(step).weights, predictor_features(s));
}

const SizeClass& AutoCalibration::size_class(size_t context_tokens) const {
  if (size_classes.empty()) throw std::logic_error("a calibration without size classes");
  const SizeClass* found = &size_classes.front();
  for (const auto& k : size_classes)
    if (context_tokens >= k.min_context_tokens) found = &k;
  return *found;
}

size_t SizeClass::policy_index(double quality) const {
  size_t i = 0;
  while (i < policies.size() && policies[i].quality < quality - 1e-9) ++i;
  return i;
}

const AutoPolicy& AutoCalibration::policy_for(double quality, size_t context_tokens) const {
  static const AutoPolicy full_prefill;
  const SizeClass& sc = size_class(context_tokens);
  const size_t i = sc.policy_index(quality);
  return i < sc.policies.size() ? sc.policies[i] : full_prefill;
}

bool accepts(const AutoPolicy& policy, double p) { return p >= policy.threshold; }

// Every subset of the ladder (kept in order) and every threshold that changes a decision
// (each distinct prediction of those steps): replay it on the cases, then keep, per target,
// the cheapest. The shares are in-sample; the held-out replay (eval::evaluate_policy) is the
// honest measure of what they deliver.
std::vector<AutoPolicy> plan_policies(const std::vector<PlanCase>& cases) {
  if (cases.empty()) throw std::invalid_argument("plan_policies: no cases");
  const size_t k_steps = cases.front().predicted.size();
  if (k_steps > kMaxLadderSteps)
    throw std::invalid_argument("a ladder of at most " + std::to_string(kMaxLadderSteps) + " steps can be planned");
  double full_ms = 0;
  for (const auto& c : cases) {
    if (c.predicted.size() != k_steps || c.identical.size() != k_steps || c.step_ms.size() != k_steps)
      throw std::invalid_argument("plan_policies: cases of different ladders");
    full_ms += c.full_ms;
  }
  const double n = static_cast<double>(cases.size());
  std::vector<AutoPolicy> candidates = {AutoPolicy{}};  // full prefill for all (shares 1, time 1)
  for (uint32_t mask = 1; mask < (1u << k_steps); ++mask) {
    std::vector<size_t> subset;
    std::vector<double> thresholds;
    for (size_t k = 0; k < k_steps; ++k)
      if (mask & (1u << k)) {
        subset.push_back(k);
        for (const auto& c : cases) thresholds.push_back(c.predicted[k]);
      }
    std::sort(thresholds.begin(), thresholds.end());
    thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
    for (double t : thresholds) {
      AutoPolicy pol;
      pol.steps = subset;
      pol.threshold = t;
      double expected = 0, observed = 0, spent = 0;
      for (const auto& c : cases) {
        const PlanOutcome o = walk(pol, c);
        spent += o.spent_ms;
        expected += o.answered < 0 ? 1.0 : c.predicted[o.answered];
        observed += o.answered < 0 || c.identical[o.answered] ? 1 : 0;
      }
      pol.expected_share = expected / n;
      pol.observed_share = observed / n;
      pol.ttft_share = full_ms > 0 ? spent / full_ms : 1.0;
      candidates.push_back(std::move(pol));
    }
  }
  std::vector<AutoPolicy> out;
  for (int percent = 1; percent <= 100; ++percent) {
    const double q = percent / 100.0;
    const AutoPolicy* best = nullptr;
    for (const auto& c : candidates)
      if (std::min(c.expected_share, c.observed_share) >= q - 1e-12 &&
          (!best || c.ttft_share < best->ttft_share - 1e-12 ||
           (std::abs(c.ttft_share - best->ttft_share) <= 1e-12 && c.steps.size() < best->steps.size())))
        best = &c;
    AutoPolicy chosen = *best;  // full prefill always qualifies
    chosen.quality = q;
    // The previous target's entry serves this one too when the choice is the same: widen it.
    if (!out.empty() && out.back().steps == chosen.steps && out.back().threshold == chosen.threshold)
      out.back().quality = q;
    else
      out.push_back(std::move(chosen));
  }
  return out;
}

PlanOutcome walk(const AutoPolicy& policy, const PlanCase& c) {
  PlanOutcome o;
  for (size_t k : policy.steps) {
    o.spent_ms += c.step_ms.at(k);
    if (accepts(policy, c.predicted.at(k))) {
      o.answered = static_cast<int>(k);
      return o;
    }
    o.rejected_ms += c.step_ms[k];
  }
  o.spent_ms += c.full_ms;
  return o;
}

std::string calibration_cache_path(const std::string& fingerprint_hex) {
  return cache_root() + "/calibrations/" + fingerprint_hex + ".auto.json";
}

namespace {
AutoCalibration checked(const std::string& text, const std::string& source, const std::string& fingerprint_hex) {
  json j;
  try {
    j = parse_json_bounded(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(source + ": not a calibration file: " + e.what());
  }
  AutoCalibration c = AutoCalibration::parse(j, source);
  if (c.fingerprint != fingerprint_hex)
    throw std::runtime_error(source + ": a calibration for model " + c.fingerprint + ", not for this model (" +
                             fingerprint_hex + "); run `chunkfuse calibrate` for this model");
  return c;
}
}  // namespace

AutoCalibration load_calibration_file(const std::string& path, const std::string& fingerprint_hex) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read the calibration file");
  std::stringstream ss;
  ss << in.rdbuf();
  return checked(ss.str(), path, fingerprint_hex);
}

std::optional<AutoCalibration> find_calibration(const std::string& fingerprint_hex) {
  const std::string cached = calibration_cache_path(fingerprint_hex);
  if (std::filesystem::exists(cached)) return load_calibration_file(cached, fingerprint_hex);
  for (const BundledFile* b = kBundledCalibrations; b->fingerprint; ++b)
    if (fingerprint_hex == b->fingerprint) return checked(b->json, b->file, fingerprint_hex);
  return std::nullopt;
}

const AutoCalibration* shared_calibration(const std::string& fingerprint_hex) {
  static std::mutex mu;
  static std::map<std::string, std::optional<AutoCalibration>> found;
  std::lock_guard lock(mu);
  auto it = found.find(fingerprint_hex);
  if (it == found.end()) it = found.emplace(fingerprint_hex, find_calibration(fingerprint_hex)).first;
  return it->second ? &*it->second : nullptr;
}

void check_quality(double quality) {
  if (!(quality > 0 && quality <= 1))
    throw std::invalid_argument("fusion.quality must be a number in (0, 1] (the share of answers identical to full prefill's)");
}

ColdPrice price_cold_chunks(const AutoCalibration& cal, const AutoPolicy& policy, size_t context_tokens,
                            size_t suffix_tokens, size_t cold_tokens) {
  if (policy.steps.empty()) throw std::invalid_argument("price_cold_chunks: a policy without steps runs no ladder");
  ColdPrice p;
  p.full_rows = static_cast<double>(context_tokens + suffix_tokens);
  p.all_cold = cold_tokens >= context_tokens;
  const AutoStep& first = cal.steps.at(policy.steps.front());
  const double share = policy.ttft_share > 0 ? policy.ttft_share
                                             : (first.ratio * static_cast<double>(context_tokens) +
                                                static_cast<double>(suffix_tokens)) / std::max(p.full_rows, 1.0);
  p.ladder_rows = static_cast<double>(cold_tokens) + share * p.full_rows;
  return p;
}

json AutoDecision::to_json() const {
  json j = {{"method", method},       {"ratio", ratio},     {"predicted_quality", predicted_quality},
            {"quality", quality},     {"threshold", threshold}, {"size_class", size_class},
            {"decision_ms", decision_ms}, {"steps_run", steps_run},
            {"calibrated", calibrated}, {"reason", reason}, {"trace", trace}};
  if (cold_chunks) {
    j["cold_chunks"] = cold_chunks;
    j["cold_tokens"] = cold_tokens;
  }
  if (cold_price) j["price_rows"] = {{"full", cold_price->full_rows}, {"ladder", cold_price->ladder_rows}};
  if (ttft_budget_ms > 0) {
    j["ttft_budget_ms"] = ttft_budget_ms;
    j["bound"] = bound;
    j["predicted_ttft_ms"] = predicted_ttft_ms;
    j["actual_ttft_ms"] = actual_ttft_ms;
  }
  return j;
}

BudgetPlan plan_budget(const AutoCalibration& cal, const AutoPolicy* policy, const CostModel& cost,
                       size_t context_tokens, size_t suffix_tokens, size_t cold_tokens, double budget_ms) {
  if (!(budget_ms > 0) || !std::isfinite(budget_ms)) throw std::invalid_argument("plan_budget: the budget must be > 0 ms");
  if (cal.steps.empty()) throw std::invalid_argument("plan_budget: a calibration without steps");
  const double ctx = static_cast<double>(context_tokens), suffix = static_cast<double>(suffix_tokens);
  const double full_ms = cost.predict_ms(ctx + suffix);
  bool cold_paid = false;  // the first step run computes the cold caches, for every later one too
  auto step_ms = [&](size_t k) {
    return cost.predict_ms(cal.steps.at(k).ratio * ctx + suffix + (cold_paid ? 0.0 : static_cast<double>(cold_tokens)));
  };
  BudgetPlan plan;
  double spent = 0;
  // Cold caches priced as without a budget: when they make the target's walk dearer than full
  // prefill, full prefill is its cheapest plan.
  const bool walk = policy && !policy->steps.empty() &&
                    (cold_tokens == 0 ||
                     price_cold_chunks(cal, *policy, context_tokens, suffix_tokens, cold_tokens).ladder());
  if (policy) {
    for (size_t k : walk ? policy->steps : std::vector<size_t>{}) {
      const double ms = step_ms(k);
      if (spent + ms > budget_ms) break;
      plan.steps.push_back(k);
      spent += ms;
      cold_paid = true;
    }
    if (plan.steps.size() == (walk ? policy->steps.size() : 0) && spent + full_ms <= budget_ms) {
      plan.full = true;  // the quality plan fits whole, escalation to full prefill included
      plan.bound = kBoundQuality;
      plan.predicted_ms = spent + full_ms;
      return plan;
    }
  }
  // The budget binds: the best answer that fits what is left, full prefill first, then the
  // ladder from its top down to just above the last step run.
  const double left = budget_ms - spent;
  plan.bound = policy ? kBoundTtft : kBoundNone;
  if (full_ms <= left) {
    plan.full = true;
    plan.predicted_ms = spent + full_ms;
    return plan;
  }
  plan.bound = kBoundTtft;
  const size_t lowest = plan.steps.empty() ? 0 : plan.steps.back() + 1;
  for (size_t k = cal.steps.size(); k-- > lowest;)
    if (step_ms(k) <= left) {
      plan.final_step = static_cast<int>(k);
      plan.predicted_ms = spent + step_ms(k);
      return plan;
    }
  if (!plan.steps.empty()) {  // nothing more fits: the last step run answers
    plan.predicted_ms = spent;
    return plan;
  }
  size_t cheapest = 0;  // nothing fits at all: the cheapest plan, and the decision says so
  for (size_t k = 1; k < cal.steps.size(); ++k)
    if (step_ms(k) < step_ms(cheapest)) cheapest = k;
  plan.final_step = static_cast<int>(cheapest);
  plan.bound = kBoundTtftUnmet;
  plan.predicted_ms = step_ms(cheapest);
  return plan;
}

namespace {
// The forward-pass rows a prefill ran: its recomputed context rows, the suffix and the part of
// S its prefix source lacked (what the cost model is refreshed with; cold caches are offline).
double rows_run(const FusionResult& r, const RagRequest& req) {
  const size_t s = req.system.size() > r.prefix_hit_tokens ? req.system.size() - r.prefix_hit_tokens : 0;
  return static_cast<double>(r.recomputed.size() + req.suffix.size() + s);
}
}  // namespace

FusionResult prefill(FusionExecutor& executor, const RagRequest& request, const FusionOptions& base,
                     const AutoCalibration* cal, double quality, AutoDecision& decision, SharedCostModel* cost) {
  const double budget = base.ttft_ms;
  if (budget != 0 && !(budget > 0 && std::isfinite(budget)))
    throw std::invalid_argument("fusion.ttft_ms must be a number of milliseconds > 0");
  if (budget > 0 && !cost) throw std::invalid_argument("auto: a ttft_ms budget needs this machine's cost model");
  if (budget == 0 || quality != 0) check_quality(quality);
  decision = AutoDecision{};
  decision.quality = quality;
  decision.ttft_budget_ms = budget;
  decision.calibrated = cal != nullptr;
  FusionOptions opt = base;
  double wasted_ms = 0;
  double offline_ms = 0;  // cold caches and metadata computed by the steps: on a server, waited for
  std::vector<ChunkFill> cold;
  BudgetPlan plan;  // without a calibration or a context: full prefill alone
  plan.full = true;
  const AutoPolicy* policy = nullptr;
  decision.reason = cal ? kReasonTarget : kReasonUncalibrated;
  if (cal && request.context_tokens() == 0) decision.reason = kReasonNoContext;
  if (cal && request.context_tokens() > 0) {
    const size_t tokens = request.context_tokens();
    if (quality > 0) policy = &cal->policy_for(quality, tokens);
    if (policy) decision.threshold = policy->threshold;
    decision.size_class = cal->size_class(tokens).min_context_tokens;
    if (budget > 0 || !policy->steps.empty()) {
      const auto t0 = SteadyClock::now();
      FusionOptions first = base;  // the caches the ladder's steps look up
      first.method = cal->steps.at(policy && !policy->steps.empty() ? policy->steps.front() : 0).method;
      cold = executor.missing_chunks(request, first);  // none under ColdChunks::offline
      for (const ChunkFill& c : cold) decision.cold_tokens += c.key.tokens().size();
      decision.cold_chunks = cold.size();
      if (budget > 0) {  // the budget's plan prices the cold caches itself
        plan = plan_budget(*cal, policy, cost->get(), tokens, request.suffix.size(), decision.cold_tokens, budget);
        decision.bound = plan.bound;
        decision.predicted_ttft_ms = plan.predicted_ms;
        if (!policy) decision.reason = kReasonBudget;  // a walk's steps say more
        else if (!policy->steps.empty() && plan.steps.empty() && plan.full && !cold.empty())
          decision.reason = kReasonColdChunks;
      } else {
        plan.steps = policy->steps;
        if (!cold.empty()) {
          decision.cold_price = price_cold_chunks(*cal, *policy, tokens, request.suffix.size(), decision.cold_tokens);
          if (!decision.cold_price->ladder()) {
            plan.steps.clear();
            decision.reason = kReasonColdChunks;
          }
        }
      }
      wasted_ms += ms_since(t0);
    }
  }
  if (budget > 0 && decision.bound.empty()) {  // no ladder to plan (no calibration, no context)
    decision.bound = kBoundNone;
    decision.predicted_ttft_ms =
        cost->get().predict_ms(static_cast<double>(request.context_tokens() + request.suffix.size()));
  }
  // One ladder step's prefill, its prediction and its trace entry.
  struct Ran {
    FusionResult r;
    size_t step = 0;
    double p = 0, cost_ms = 0;  // cost_ms: its TTFT plus the predictor's time
  };
  auto run_step = [&](size_t k) {
    const AutoStep& step = cal->steps.at(k);
    opt.method = step.method;
    opt.ratio = step.ratio;
    opt.method_options = step.options;
    Ran ran{executor.prefill(request, opt), k, 0, 0};
    if (cost) cost->observe(rows_run(ran.r, request), ran.r.timings.ttft_ms);
    offline_ms += ran.r.timings.offline_ms;
    const auto t0 = SteadyClock::now();
    ran.p = cal->predict(k, first_token_signals(ran.r.logits));
    ran.cost_ms = ran.r.timings.ttft_ms + ms_since(t0);
    ++decision.steps_run;
    decision.trace.push_back({{"method", step.method}, {"ratio", step.ratio}, {"predicted", ran.p}, {"ttft_ms", ran.r.timings.ttft_ms}});
    return ran;
  };
  auto answer = [&](Ran ran, const char* reason) {
    decision.reason = reason;
    decision.method = cal->steps.at(ran.step).method;
    decision.ratio = cal->steps.at(ran.step).ratio;
    decision.predicted_quality = ran.p;
    decision.decision_ms = wasted_ms + (ran.cost_ms - ran.r.timings.ttft_ms);
    ran.r.timings.ttft_ms += decision.decision_ms;
    decision.actual_ttft_ms = ran.r.timings.ttft_ms + offline_ms;
    return std::move(ran.r);
  };
  std::optional<Ran> last;
  for (size_t k : plan.steps) {
    Ran ran = run_step(k);
    if (policy && accepts(*policy, ran.p)) return answer(std::move(ran), kReasonAccepted);
    wasted_ms += ran.cost_ms;
    decision.reason = kReasonEscalated;
    last = std::move(ran);
  }
  if (plan.final_step >= 0) return answer(run_step(static_cast<size_t>(plan.final_step)), kReasonBudget);
  if (!plan.full && last) {  // the budget ends the walk: the last step run answers
    wasted_ms -= last->cost_ms;
    return answer(std::move(*last), kReasonBudget);
  }
  opt.method = full_method_name();
  opt.ratio = 1.0;
  opt.method_options = json::object();
  FusionResult r = executor.prefill(request, opt);
  if (cost) cost->observe(rows_run(r, request), r.timings.ttft_ms);
  r.chunk_misses = request.chunks.size();  // the answer used no chunk cache: every chunk was prefilled
  ++decision.steps_run;
  decision.trace.push_back({{"method", opt.method}, {"ratio", 1.0}, {"predicted", 1.0}, {"ttft_ms", r.timings.ttft_ms}});
  decision.method = opt.method;
  decision.ratio = 1.0;
  decision.predicted_quality = 1.0;
  decision.decision_ms = wasted_ms;
  r.timings.ttft_ms += wasted_ms;
  decision.actual_ttft_ms = r.timings.ttft_ms + offline_ms;
  // Full prefill answered and no step computed the cold caches: the caller computes them off
  // this request's path.
  if (plan.steps.empty()) r.chunks_to_fill = std::move(cold);
  return r;
}

}  // namespace cf::autoq

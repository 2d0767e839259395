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

AutoCalibration AutoCalibration::parse(const json& j, const std::string& source) {
  if (!j.is_object()) throw field_error(source, "a calibration is a JSON object");
  if (j.value("format", "") != kCalibrationFormat)
    throw field_error(source, std::string("format must be \"") + kCalibrationFormat + "\"");
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
      st.max_predicted = s.at("max_predicted").get<double>();
      st.predictions = s.value("predictions", std::vector<double>{});
      st.ttft_share = s.value("ttft_share", 0.0);
    } catch (const json::exception& e) {
      throw field_error(source, std::string("a step needs method, ratio, weights, max_predicted: ") + e.what());
    }
    if (st.weights.size() != kFeatureCount + 1)
      throw field_error(source, "step weights must have " + std::to_string(kFeatureCount + 1) + " numbers");
    if (!(st.ratio >= 0 && st.ratio <= 1)) throw field_error(source, "step ratio must be in [0, 1]");
    for (double w : st.weights)
      if (!std::isfinite(w)) throw field_error(source, "step weights must be finite");
    if (!(st.ttft_share >= 0 && std::isfinite(st.ttft_share))) throw field_error(source, "step ttft_share must be a number >= 0");
    for (double p : st.predictions)
      if (!(p >= 0 && p <= 1)) throw field_error(source, "step predictions must be probabilities");
    if (!std::is_sorted(st.predictions.begin(), st.predictions.end()))
      throw field_error(source, "step predictions must be in ascending order");
    c.steps.push_back(std::move(st));
  }
  c.provenance = j.value("provenance", json::object());
  return c;
}

json AutoCalibration::to_json() const {
  json out = json::array();
  for (const auto& s : steps)
    out.push_back({{"method", s.method}, {"ratio", s.ratio}, {"options", s.options}, {"weights", s.weights},
                     {"max_predicted", s.max_predicted}, {"predictions", s.predictions}, {"ttft_share", s.ttft_share}});
  return {{"format", kCalibrationFormat},
          {"fingerprint", fingerprint},
          {"features", {"margin", "entropy"}},
          {"steps", out},
          {"provenance", provenance}};
}

double AutoCalibration::predict(size_t step, const FirstTokenSignals& s) const {
  return logistic(steps.at(step).weights, predictor_features(s));
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
    throw std::invalid_argument("fusion.quality must be a number in (0, 1] (the probability of an answer identical to full prefill's)");
}

bool accepts(const AutoCalibration& cal, size_t step, const FirstTokenSignals& s, double quality) {
  return cal.predict(step, s) >= quality;
}

bool worth_running(const AutoCalibration& cal, size_t step, double quality) {
  const AutoStep& s = cal.steps.at(step);
  if (s.max_predicted < quality) return false;
  if (s.predictions.empty() || s.ttft_share <= 0) return true;  // a file from before they were recorded
  const auto first_accepted = std::lower_bound(s.predictions.begin(), s.predictions.end(), quality);
  const double answered = static_cast<double>(s.predictions.end() - first_accepted) / static_cast<double>(s.predictions.size());
  return answered > s.ttft_share;
}

json AutoDecision::to_json() const {
  return {{"method", method},       {"ratio", ratio},     {"predicted_quality", predicted_quality},
          {"quality", quality},     {"decision_ms", decision_ms}, {"steps_run", steps_run},
          {"calibrated", calibrated}, {"trace", trace}};
}

FusionResult prefill(FusionExecutor& executor, const RagRequest& request, const FusionOptions& base,
                     const AutoCalibration* cal, double quality, AutoDecision& decision) {
  check_quality(quality);
  decision = AutoDecision{};
  decision.quality = quality;
  decision.calibrated = cal != nullptr;
  FusionOptions opt = base;
  double wasted_ms = 0;
  if (cal) {
    for (size_t k = 0; k < cal->steps.size(); ++k) {
      if (!worth_running(*cal, k, quality)) continue;
      const AutoStep& step = cal->steps[k];
      opt.method = step.method;
      opt.ratio = step.ratio;
      opt.method_options = step.options;
      FusionResult r = executor.prefill(request, opt);
      const auto t0 = SteadyClock::now();
      const FirstTokenSignals s = first_token_signals(r.logits);
      const double p = cal->predict(k, s);  // reported; accepts() decides, as the replay does
      const bool accepted = accepts(*cal, k, s, quality);
      const double predict_ms = ms_since(t0);
      ++decision.steps_run;
      decision.trace.push_back({{"method", step.method}, {"ratio", step.ratio}, {"predicted", p}, {"ttft_ms", r.timings.ttft_ms}});
      if (accepted) {
        decision.method = step.method;
        decision.ratio = step.ratio;
        decision.predicted_quality = p;
        decision.decision_ms = wasted_ms + predict_ms;
        r.timings.ttft_ms += wasted_ms + predict_ms;
        return r;
      }
      wasted_ms += r.timings.ttft_ms + predict_ms;
    }
  }
  opt.method = "full";
  opt.ratio = 1.0;
  opt.method_options = json::object();
  FusionResult r = executor.prefill(request, opt);
  ++decision.steps_run;
  decision.trace.push_back({{"method", "full"}, {"ratio", 1.0}, {"predicted", 1.0}, {"ttft_ms", r.timings.ttft_ms}});
  decision.method = "full";
  decision.ratio = 1.0;
  decision.predicted_quality = 1.0;
  decision.decision_ms = wasted_ms;
  r.timings.ttft_ms += wasted_ms;
  return r;
}

}  // namespace cf::autoq

#include "serve/self_check_ledger.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "serve/vllm_metrics.h"

namespace cf {

using json = nlohmann::json;

ShareInterval wilson_interval(uint64_t k, uint64_t n, double z) {
  if (n == 0) return {};
  const double nn = static_cast<double>(n), p = static_cast<double>(std::min(k, n)) / nn, z2 = z * z;
  const double denom = 1 + z2 / nn;
  const double center = (p + z2 / (2 * nn)) / denom;
  const double half = z * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / denom;
  return {std::max(0.0, center - half), std::min(1.0, center + half)};
}

uint64_t min_checks(double q, double z) {
  if (q >= 1) return 20;
  const double need = std::ceil(z * z * q / (1 - q) - 1e-9);  // the epsilon: q/(1-q) of a round q
  return std::max<uint64_t>(20, static_cast<uint64_t>(std::max(0.0, need)));
}

CheckOutcome compare_answers(TokenId fused_first, TokenId full_first, std::span<const TokenId> fused, bool fused_eos,
                             std::span<const TokenId> full, bool full_eos) {
  CheckOutcome o;
  o.first_token_agree = fused_first == full_first;
  o.identical = std::equal(fused.begin(), fused.end(), full.begin(), full.end()) && (!fused_eos || full_eos);
  return o;
}

SelfCheckSampler::SelfCheckSampler(double share) : share_(share) {
  if (!(share >= 0 && share <= 1))
    throw std::invalid_argument("the self-check share must be in [0, 1] (the share of served fused requests checked)");
}

bool SelfCheckSampler::next() {
  const uint64_t n = ++seen_;
  const auto before = static_cast<uint64_t>(std::floor(static_cast<double>(n - 1) * share_ + 1e-9));
  const auto now = static_cast<uint64_t>(std::floor(static_cast<double>(n) * share_ + 1e-9));
  return now > before;
}

bool should_recalibrate(const PlanRecord& r) {
  if (r.quality <= 0 || r.recalibrated || r.checked < min_checks(r.quality)) return false;
  if (r.quality >= 1) return r.identical < r.checked;
  return r.identical_interval().low < r.quality;
}

bool SelfCheckLedger::record(const std::string& plan, double quality, CheckOutcome o) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(plans_.begin(), plans_.end(),
                         [&](const PlanRecord& r) { return r.plan == plan && r.quality == quality; });
  if (it == plans_.end()) {
    plans_.push_back({plan, quality});
    it = plans_.end() - 1;
  }
  ++it->checked;
  it->first_token_agree += o.first_token_agree;
  it->identical += o.identical;
  if (!should_recalibrate(*it)) return false;
  it->recalibrated = true;
  return true;
}

std::vector<PlanRecord> SelfCheckLedger::records() const {
  std::lock_guard lock(mu_);
  std::vector<PlanRecord> out = plans_;
  std::sort(out.begin(), out.end(), [](const PlanRecord& a, const PlanRecord& b) { return a.plan < b.plan; });
  return out;
}

std::optional<PlanRecord> SelfCheckLedger::find(const std::string& plan, double quality) const {
  std::lock_guard lock(mu_);
  for (const PlanRecord& r : plans_)
    if (r.plan == plan && r.quality == quality) return r;
  return std::nullopt;
}

json plan_record_json(const PlanRecord& r) {
  const ShareInterval id = r.identical_interval(), ft = r.first_token_interval();
  json p = {{"plan", r.plan},
            {"checked", r.checked},
            {"first_token_agree", r.first_token_agree},
            {"identical", r.identical},
            {"first_token_interval", {ft.low, ft.high}},
            {"identical_interval", {id.low, id.high}},
            {"recalibrated", r.recalibrated}};
  if (r.quality > 0) {
    p["quality"] = r.quality;
    p["min_checks"] = min_checks(r.quality);
  }
  return p;
}

json self_check_json(const SelfCheckSnapshot& s) {
  json plans = json::array();
  for (const PlanRecord& r : s.plans) plans.push_back(plan_record_json(r));
  const SelfCheckCounters& c = s.counters;
  return {{"object", "self_check"}, {"share", c.share},         {"sampled", c.sampled}, {"dropped", c.dropped},
          {"completed", c.completed}, {"pending", c.pending}, {"interval", "wilson 95%"}, {"plans", plans}};
}

std::string self_check_prometheus(const SelfCheckSnapshot& s) {
  std::ostringstream os;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
    for (const PlanRecord& r : s.plans) os << name << "{plan=\"" << prometheus_label_value(r.plan) << "\"} " << value(r) << '\n';
  };
  family("chunkfuse_self_check_checked_total", "counter", "Served fused answers checked against full prefill when idle.",
         [](const PlanRecord& r) { return r.checked; });
  family("chunkfuse_self_check_first_token_agree_total", "counter", "Checked answers whose first token was full prefill's.",
         [](const PlanRecord& r) { return r.first_token_agree; });
  family("chunkfuse_self_check_identical_total", "counter", "Checked answers identical to full prefill's.",
         [](const PlanRecord& r) { return r.identical; });
  family("chunkfuse_self_check_identical_lower", "gauge", "Wilson 95% lower bound of the share of identical answers.",
         [](const PlanRecord& r) { return r.identical_interval().low; });
  family("chunkfuse_self_check_recalibrated", "gauge", "1 once the plan's lower bound fell below its target.",
         [](const PlanRecord& r) { return r.recalibrated ? 1 : 0; });
  os << "# HELP chunkfuse_self_check_dropped_total Sampled requests dropped unchecked (queue full, oldest first).\n"
     << "# TYPE chunkfuse_self_check_dropped_total counter\nchunkfuse_self_check_dropped_total " << s.counters.dropped
     << "\n# HELP chunkfuse_self_check_pending Sampled requests waiting for an idle check.\n"
     << "# TYPE chunkfuse_self_check_pending gauge\nchunkfuse_self_check_pending " << s.counters.pending << '\n';
  return os.str();
}

}  // namespace cf

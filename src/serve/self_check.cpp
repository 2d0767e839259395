#include "serve/self_check.h"

#include <algorithm>
#include <cstdio>

#include "fusion/methods.h"
#include "runtime/sampler.h"

namespace cf {
namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string plan_name(const std::string& method, double ratio) { return method + "@" + number(ratio); }

}  // namespace

std::optional<SelfCheckCase> self_check_case(const RequestPlan& plan, const FusionResult& fusion,
                                             const DecodeSession& answer, TokenId fused_first,
                                             const autoq::AutoCalibration* cal) {
  if (!plan.fused || plan.generate.sampling.temperature != 0) return std::nullopt;
  const std::string& why = answer.stop_reason();
  if (why != "eos" && why != "length" && why != "stop") return std::nullopt;  // cancelled: no whole answer
  SelfCheckCase c;
  if (plan.fusion.automatic()) {
    const nlohmann::json& d = fusion.auto_decision;
    if (!d.is_object() || is_full_prefill(d.value("method", std::string()))) return std::nullopt;  // exact already
    const std::string method = d.value("method", std::string());
    const double ratio = d.value("ratio", 1.0);
    if (d.value("reason", std::string()) == autoq::kReasonAccepted && plan.fusion.quality > 0) {
      c.plan = "auto@" + number(plan.fusion.quality) + ":" + plan_name(method, ratio);
      c.quality = plan.fusion.quality;
      for (size_t k = 0; cal && k < cal->steps.size(); ++k)
        if (cal->steps[k].method == method && cal->steps[k].ratio == ratio) c.auto_step = k;
    } else {
      c.plan = "auto:" + d.value("reason", std::string("?")) + ":" + plan_name(method, ratio);
    }
  } else {
    const MethodEntry& m = method_entry(plan.fusion.method);
    c.plan = plan_name(plan.fusion.method, m.takes_ratio() ? plan.fusion.ratio : m.fixed_ratio);
  }
  c.prompt = plan.rag.flatten();
  c.fused_first = fused_first;
  const auto& t = answer.tokens();
  c.fused_answer.assign(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(std::min(t.size(), SelfCheckOptions::kAnswerCap)));
  c.fused_eos = why == "eos" && t.size() <= SelfCheckOptions::kAnswerCap;
  c.sampling = plan.generate.sampling;
  return c;
}

const autoq::AutoCalibration* calibration_to_check(const std::string& fingerprint_hex, double share) {
  if (share <= 0) return nullptr;
  try {
    return autoq::shared_calibration(fingerprint_hex);
  } catch (const std::exception&) {
    return nullptr;
  }
}

TokenId top_token(std::span<const float> logits) { return logits.empty() ? -1 : argmax(logits.data(), logits.size()); }

autoq::AutoCalibration without_step(const autoq::AutoCalibration& cal, double quality, size_t step) {
  autoq::AutoCalibration out = cal;
  for (autoq::SizeClass& sc : out.size_classes) {
    const size_t i = sc.policy_index(quality);  // the one AutoCalibration::policy_for picks
    if (i == sc.policies.size()) continue;      // full prefill already
    std::vector<size_t>& steps = sc.policies[i].steps;
    steps.erase(std::remove(steps.begin(), steps.end(), step), steps.end());
  }
  return out;
}

// The check in progress: the reference's cache and decoding.
struct SelfCheck::Active {
  SelfCheckCase c;
  size_t step = 0;     // idle steps taken
  size_t prefilled = 0;  // prompt rows in `cache`
  std::optional<KvCache> cache;
  TokenId full_first = -1;
  GenerateOptions generate;  // outlives `session`
  std::optional<DecodeSession> session;
  int32_t next_position = 0;
};

SelfCheck::SelfCheck(Scheduler& scheduler, const Tokenizer& tokenizer, SelfCheckOptions opt,
                     const autoq::AutoCalibration* calibration)
    : scheduler_(scheduler), tok_(tokenizer), opt_(std::move(opt)), sampler_(opt_.share) {
  if (opt_.piece_rows == 0) opt_.piece_rows = SchedulerOptions::kDefaultPrefillChunk;
  counters_.share = opt_.share;
  if (calibration) cal_ = std::make_shared<const autoq::AutoCalibration>(*calibration);
  if (enabled()) scheduler_.set_idle_worker([this](Forward& fw) { return step(fw); });
}

SelfCheck::~SelfCheck() = default;

nlohmann::json SelfCheck::offer(const RequestPlan& plan, const FusionResult& fusion, const DecodeSession& answer,
                                TokenId fused_first) {
  if (!enabled()) return nullptr;
  std::optional<SelfCheckCase> c = self_check_case(plan, fusion, answer, fused_first, calibration().get());
  if (!c) return nullptr;
  const std::optional<PlanRecord> record = ledger_.find(c->plan, c->quality);
  nlohmann::json note = {{"plan", c->plan}, {"sampled", sampler_.next()},
                         {"record", record ? plan_record_json(*record) : nlohmann::json(nullptr)}};
  if (note["sampled"]) submit(std::move(*c));
  return note;
}

void SelfCheck::submit(SelfCheckCase c) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= opt_.max_pending) {
      queue_.pop_front();
      ++counters_.dropped;
    }
    queue_.push_back(std::move(c));
    ++counters_.sampled;
  }
  scheduler_.wake_idle_worker();
}

std::shared_ptr<const autoq::AutoCalibration> SelfCheck::calibration() const {
  std::lock_guard lock(mu_);
  return cal_;
}

SelfCheckSnapshot SelfCheck::snapshot() const {
  SelfCheckSnapshot s;
  {
    std::lock_guard lock(mu_);
    s.counters = counters_;
    s.counters.pending = queue_.size() + (counters_.pending ? 1 : 0);  // counters_.pending: one in progress
  }
  s.plans = ledger_.records();
  return s;
}

bool SelfCheck::step(Forward& fw) {
  if (!active_) {
    std::lock_guard lock(mu_);
    if (queue_.empty()) return false;
    active_ = std::make_unique<Active>();
    active_->c = std::move(queue_.front());
    queue_.pop_front();
    counters_.pending = 1;
  }
  Active& a = *active_;
  if (opt_.on_step) opt_.on_step(a.step);
  ++a.step;
  try {
    if (a.prefilled < a.c.prompt.size())
      prefill_piece(fw, a);
    else
      decode_one(fw, a);
  } catch (...) {  // a failed pass (memory): this case is dropped unchecked, not counted
    active_.reset();
    std::lock_guard lock(mu_);
    counters_.pending = 0;
    ++counters_.dropped;
    return !queue_.empty();
  }
  std::lock_guard lock(mu_);
  return active_ || !queue_.empty();
}

// The reference prefill, `piece_rows` prompt rows per idle step, into one cache; after the last
// piece full prefill's first token is chosen from its logits (greedy, the served answer's
// sampling), as the scheduler does.
void SelfCheck::prefill_piece(Forward& fw, Active& a) {
  const size_t n = a.c.prompt.size();
  if (!a.cache) a.cache.emplace(fw.model().hparams(), n + a.c.fused_answer.size() + 2);
  const size_t end = std::min(n, a.prefilled + opt_.piece_rows);
  std::vector<int32_t> pos(end - a.prefilled);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(a.prefilled + i);
  const size_t last = pos.size() - 1;
  const bool final = end == n;
  ForwardOutput out = fw.run(*a.cache, {std::span<const TokenId>(a.c.prompt).subspan(a.prefilled, pos.size()), pos, {},
                                        final ? std::span<const size_t>(&last, 1) : std::span<const size_t>()});
  a.prefilled = end;
  if (!final) return;
  a.full_first = top_token(out.logits);
  a.generate.max_tokens = static_cast<int>(a.c.fused_answer.size() + (a.c.fused_eos ? 1 : 0));
  a.generate.sampling = a.c.sampling;  // no stop strings: tokens are compared, not text
  a.next_position = static_cast<int32_t>(n);
  a.session.emplace(tok_, a.generate, a.c.prompt);
  if (a.generate.max_tokens == 0 || !a.session->step(out.logits.data(), out.logits.size()))
    finish(a, a.session->stop_reason() == "eos");
}

// One decode token of the reference, the pass the scheduler's batched decode step runs for one
// sequence (PerRow K-quant order: a decode row's bits do not depend on its batch).
void SelfCheck::decode_one(Forward& fw, Active& a) {
  static const size_t kRow0 = 0;
  const TokenId token = a.session->last_token();
  const int32_t position = a.next_position++;
  BatchSequence seq{&*a.cache,
                    ForwardInput{std::span<const TokenId>(&token, 1), std::span<const int32_t>(&position, 1), {},
                                 std::span<const size_t>(&kRow0, 1), WeightMatrix::KQuantOrder::PerRow}};
  std::vector<ForwardOutput> outs = fw.run_batch({&seq, 1});
  if (!a.session->step(outs[0].logits.data(), outs[0].vocab)) finish(a, a.session->stop_reason() == "eos");
}

void SelfCheck::finish(Active& a, bool full_eos) {
  const std::vector<TokenId> none;
  const std::vector<TokenId>& full = a.session ? a.session->tokens() : none;
  const CheckOutcome o = compare_answers(a.c.fused_first, a.full_first, a.c.fused_answer, a.c.fused_eos, full, full_eos);
  if (ledger_.record(a.c.plan, a.c.quality, o) && a.c.auto_step) {
    std::lock_guard lock(mu_);
    if (cal_) {
      cal_ = std::make_shared<const autoq::AutoCalibration>(without_step(*cal_, a.c.quality, *a.c.auto_step));
      std::fprintf(stderr,
                   "chunkfuse serve: self-check: %s is below its target (Wilson 95%% lower bound); the auto policy "
                   "no longer answers with that step at this target\n",
                   a.c.plan.c_str());
    }
  }
  std::unique_ptr<Active> done = std::move(active_);
  std::lock_guard lock(mu_);
  counters_.pending = 0;
  ++counters_.completed;
}

}  // namespace cf

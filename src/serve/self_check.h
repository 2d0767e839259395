// The server checks itself while serving (issue 60 item 3): a share of the served fused
// answers (serve --self-check SHARE, sampled deterministically: serve/self_check_ledger.h) is
// queued with what re-running it needs (the prompt S c1..cm U, the fused answer's first token
// and answer tokens, its plan), and when the server is idle each is run again with full
// prefill and greedy decoding and compared: first token, whole answer (its first kAnswerCap
// tokens). The counts per plan are the ledger's (GET /v1/self_check, /metrics).
//
// Never on a request's path. The checks run as the scheduler's idle worker
// (Scheduler::set_idle_worker): only when no request waits or runs, one bounded step per turn
// of the loop, and a request that arrives is admitted at the next turn, so it waits for one
// step at most. A step is one pass of at most `piece_rows` prompt rows of the reference
// prefill (the prefill is split into passes over one cache, which gives the bits of one pass:
// Forward::run_in_passes) or one decode token. The queue is bounded (oldest dropped, counted).
// Deviation: the check's K/V (one prompt's, while it runs) is outside serve --kv-budget's
// reservations; it is held only while no request runs, but a request admitted mid-check meets it.
//
// Recalibration (the auto policy): when the ledger's rule fires for "auto at target q,
// answered by ladder step k" (lower bound of identical answers below q after min_checks(q)
// checks), step k is taken out of the policy serving q, in every size class, in this server's
// copy of the calibration, which the engine's executor uses from then on (FusionExecutor::
// set_calibration): requests at that target escalate past it, to the next step or to full
// prefill. The smallest honest change: the policy's other steps, its threshold and the
// calibration file stay as calibrated; the change lasts until a restart. That policy may serve
// neighbouring targets too (calibrate merges targets with the same choice): they get the more
// conservative walk as well. Answers chosen by a ttft_ms budget are counted, never recalibrate.
#pragma once
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fusion/auto_quality.h"
#include "runtime/forward.h"
#include "runtime/generate.h"
#include "serve/request_plan.h"
#include "serve/scheduler.h"
#include "serve/self_check_ledger.h"

namespace cf {

struct SelfCheckOptions {
  double share = 0;           // serve --self-check (the engine's default: off)
  size_t max_pending = 8;     // sampled answers waiting; older ones are dropped first
  size_t piece_rows = 256;    // prompt rows of the reference prefill per idle step
  static constexpr size_t kAnswerCap = 32;  // answer tokens compared
  // Tests: called on the scheduler thread at the start of each idle step (0, 1, ... per check).
  std::function<void(size_t step)> on_step;
};

// One served fused answer to check.
struct SelfCheckCase {
  std::string plan;          // the ledger's name for it
  double quality = 0;        // the target it is held to (auto); 0: none
  std::optional<size_t> auto_step;  // the auto policy's answering ladder step (recalibration)
  std::vector<TokenId> prompt;      // S c1..cm U as served
  TokenId fused_first = -1;         // top-1 of the fused prefill's logits
  std::vector<TokenId> fused_answer;  // at most kAnswerCap tokens
  bool fused_eos = false;             // the answer ended there on end-of-generation
  SamplingParams sampling;            // greedy (only greedy answers are sampled)
};

// The case of a finished request, if it is one the self-check may check: fused (the auto
// policy's answer a ladder step), greedy, not cancelled. `cal`: the calibration the prefill
// used (to name the auto step).
std::optional<SelfCheckCase> self_check_case(const RequestPlan& plan, const FusionResult& fusion,
                                             const DecodeSession& answer, TokenId fused_first,
                                             const autoq::AutoCalibration* cal);

// The auto policy's calibration of the model, for a self-check of `share` to recalibrate (null:
// off, or none; a file of another model is refused on the first auto request, as before).
const autoq::AutoCalibration* calibration_to_check(const std::string& fingerprint_hex, double share);
// The top-1 of a prefill's logits (runtime/sampler.h's argmax: greedy's choice; -1: none).
TokenId top_token(std::span<const float> logits);

// The calibration with ladder step `step` out of the policy serving `quality` in every size class.
autoq::AutoCalibration without_step(const autoq::AutoCalibration& cal, double quality, size_t step);

class SelfCheck {
 public:
  // Registers itself as `scheduler`'s idle worker; `calibration` (optional) is the auto policy's
  // to recalibrate. Must outlive the scheduler's thread.
  SelfCheck(Scheduler& scheduler, const Tokenizer& tokenizer, SelfCheckOptions opt,
            const autoq::AutoCalibration* calibration);
  ~SelfCheck();
  bool enabled() const { return opt_.share > 0; }

  // Scheduler thread, at the end of a request: samples it (deterministically) and queues its
  // case. Returns the request's note (CompletionResult::self_check): its plan, whether it was
  // sampled, the plan's record so far (null: off, or not an answer the self-check checks).
  nlohmann::json offer(const RequestPlan& plan, const FusionResult& fusion, const DecodeSession& answer, TokenId fused_first);
  // Queues a case as offer() does once sampled (any thread; the oldest dropped when full).
  void submit(SelfCheckCase c);
  // The calibration the auto policy answers with now (recalibrated; null: none).
  std::shared_ptr<const autoq::AutoCalibration> calibration() const;
  SelfCheckSnapshot snapshot() const;

 private:
  struct Active;
  bool step(Forward& fw);  // the idle worker: one pass; true while work is left
  void prefill_piece(Forward& fw, Active& a);
  void decode_one(Forward& fw, Active& a);
  void finish(Active& a, bool full_eos);

  Scheduler& scheduler_;
  const Tokenizer& tok_;
  SelfCheckOptions opt_;
  SelfCheckSampler sampler_;  // scheduler thread only
  SelfCheckLedger ledger_;
  mutable std::mutex mu_;
  std::deque<SelfCheckCase> queue_;                   // guarded by mu_
  SelfCheckCounters counters_;                        // guarded by mu_ (pending filled on snapshot)
  std::shared_ptr<const autoq::AutoCalibration> cal_;  // guarded by mu_
  std::unique_ptr<Active> active_;                    // scheduler thread only
};

}  // namespace cf

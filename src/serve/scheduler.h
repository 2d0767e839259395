// The serving loop (issue 5, item 2): one thread owns the Forward pass and its thread pool.
// Requests wait in a bounded FIFO queue; each iteration the loop runs the queued tasks
// (chunk registration), prefills ONE waiting request if a running slot is free, then runs
// ONE batched decode step for every running request (continuous batching: a new request
// joins the batch as soon as its prefill is done, a finished one leaves it at once).
// Decode steps go through Forward::run_batch, whose rows are batch-invariant, so a greedy
// answer does not depend on which requests it was batched with.
//
// Chunked prefill (issue 58 item 1, as Sarathi-Serve and vLLM V1 do): a prefill, a task or an
// idle task runs its forward passes in pieces of at most `prefill_chunk` rows
// (Forward::PassSplit), and every running request decodes one token between two pieces, so a
// long prompt no longer stalls every stream for its whole prefill. Splitting at row
// boundaries is exact (Forward::run_in_passes). While requests decode, a piece is sized by the
// time it may take (serve/piece_sizer.h: the inter-token-latency target, by default 3x the decode
// step of the batch the requests in the server would form), at most `prefill_chunk` rows, and
// measured after it ran (its rows and their positions, as the Forward pass hands them to
// `between`). Deviation from those systems: a step's decode rows and prefill rows run as two
// passes, not one mixed batch, and one request prefills at a time. A selector's pass whose hooks
// only stop it is cut into rows the same way; one whose hooks see every row of a layer at once
// (a probe) is cut between layers instead (Forward::PassSplit::between_layers), each run of
// layers sized like a piece; those runs are not measured.
//
// Order (issue 58 item 2): FIFO by default. `priority` serves the lowest SchedulerJob::priority
// first (vLLM's convention), `shortest` the least prefill work (SchedulerJob::work: fused
// requests are ~5x cheaper than full ones); ties in arrival order. No job starves: one that has
// waited `max_wait_ms` goes before every younger one, whatever the order.
//
// KV memory in bytes (issue 58 item 3): one budget (serve/kv_budget.h) covers the running jobs'
// reservations (SchedulerJob::kv_bytes: prompt + max_tokens of K/V, held from admission to the
// end) and the cached K/V of the prefix cache and the chunk store's memory tier. A job is
// admitted to prefill when its reservation fits beside the running jobs' ones; the caches are
// evictable and give back what it needs first (counted in KvBudget::admission_evicted_bytes).
// When the reservations alone leave too little it keeps its place in the queue until one
// finishes. A job larger than the whole budget is refused at submit (413). A running job is never
// preempted, for a cache or another job: its reservation already covers its growth.
//
// Cancellation (issue 58 item 4): a waiter whose client is gone sets the job's `cancel`; a
// waiting job then leaves the queue unprefilled, a prefilling one stops at its next piece and
// a running one at its next decode step, each failing with RequestError 499.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/forward.h"
#include "runtime/generate.h"
#include "serve/kv_budget.h"
#include "serve/piece_sizer.h"
#include "serve/request.h"

namespace cf {

// What a request's prefill hands to decoding.
struct PrefillOutput {
  std::vector<float> logits;  // of the last prompt row
  KvCache cache;              // the prompt's K/V
  int32_t next_position = 0;  // where the first generated token goes
};

struct SchedulerJob {
  using Clock = std::chrono::steady_clock;
  // Set by the submitter. Both functions run on the scheduler thread.
  std::function<PrefillOutput(Forward&)> prefill;
  std::function<void(SchedulerJob&)> on_finish;  // after the last step (optional): cache, session are final
  GenerateOptions generate;                       // on_text returning false cancels
  std::vector<TokenId> history;                   // the prompt (repetition penalty)
  int priority = 0;   // SchedulerOrder::priority: lower goes first
  size_t work = 0;    // SchedulerOrder::shortest: prefill rows it is expected to cost
  size_t kv_bytes = 0;  // the K/V it may hold at most (SchedulerOptions::kv_budget_bytes)

  // Filled by the scheduler.
  std::optional<KvCache> cache;
  std::optional<DecodeSession> session;
  int32_t next_position = 0;
  std::exception_ptr error;  // prefill or decode failed (the job is done)
  Clock::time_point arrival, started, first_token, finished;
  Clock::time_point last_token;      // the latest decode step's token
  std::vector<float> token_gaps_ms;  // between consecutive tokens after the first (inter-token latency)
  bool done = false;         // guarded by the scheduler's mutex
  bool kv_reserved = false;  // kv_bytes counted in the scheduler's reservation (its mutex)
  std::atomic<bool> cancel{false};  // set by its waiter (wait()'s client_gone), or by anyone
};

enum class SchedulerOrder { fifo, priority, shortest };
// "fifo" | "priority" | "shortest"; false on anything else.
bool parse_scheduler_order(const std::string& name, SchedulerOrder& out);

struct SchedulerOptions {
  size_t max_queue = 64;  // waiting jobs; submit() refuses more
  size_t max_batch = 8;   // jobs decoding together
  // Rows of a prefill between two decode steps of the running requests (0: whole prefills).
  // The default is measured (docs/benchmarks-history.md, "Prefill pieces sized by an
  // inter-token-latency target": fixed pieces, TTFT against inter-token latency on 2 cores); with
  // nobody decoding a piece takes all of it, beside streaming answers itl_target_ms sizes it.
  size_t prefill_chunk = kDefaultPrefillChunk;
  static constexpr size_t kDefaultPrefillChunk = 256;
  // The gap between two tokens of a running answer that a prefill piece is sized for
  // (PrefillPieceSizer: kAuto, 0 off, or milliseconds).
  double itl_target_ms = PrefillPieceSizer::kAuto;
  SchedulerOrder order = SchedulerOrder::fifo;
  size_t max_wait_ms = 30000;  // the age bound of a non-FIFO order
  size_t kv_budget_bytes = 0;  // K/V the admitted jobs may reserve together; 0: unbounded
  // The budget shared with the caches (serve/kv_budget.h), which must outlive the scheduler;
  // null: the scheduler's own of kv_budget_bytes, with no cache under it.
  KvBudget* kv_budget = nullptr;
};

// What a cancelled job fails with (499, nginx's "client closed request"; nobody reads it).
constexpr int kClientGoneStatus = 499;
RequestError client_gone_error();

class Scheduler {
 public:
  Scheduler(Forward& fwd, SchedulerOptions opt);
  ~Scheduler();  // jobs still waiting or running fail with RequestError 503
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the job (arrival time stamped here); throws RequestError 503 when the queue is
  // full or the scheduler is stopping. The job must stay alive until wait() returns.
  void submit(SchedulerJob& job);
  // Blocks until the job is done; rethrows its error. client_gone (optional) is asked on the
  // waiting thread every kCancelPollMs; once it says yes the job is cancelled.
  void wait(SchedulerJob& job, const std::function<bool()>& client_gone = {});
  static constexpr int kCancelPollMs = 50;

  // Runs fn on the scheduler thread between steps (work that needs the Forward pass, such as
  // computing a chunk cache) and waits for it; rethrows what it throws.
  void call(const std::function<void(Forward&)>& fn);

  // Queues fn to run on the scheduler thread when no request is waiting for its prefill
  // (background work off every request's TTFT path, e.g. computing an exact prefix
  // CRAFT promoted). Fire and forget: errors are dropped, at most `kMaxIdleTasks` wait
  // (older ones are dropped first), and tasks not yet run at shutdown never run.
  void post_idle(std::function<void(Forward&)> fn);
  static constexpr size_t kMaxIdleTasks = 16;
  uint64_t idle_tasks_run() const { return idle_tasks_run_.load(); }

  // The idle worker (serve/self_check.h): `step` runs one bounded piece of background work when
  // no request waits or runs and no task or idle task is queued, and returns whether more is
  // left; wake_idle_worker() says there is work again. Stricter than post_idle (no running
  // request is slowed either), and a request that arrives waits for the step in progress only.
  void set_idle_worker(std::function<bool(Forward&)> step);
  void wake_idle_worker();

  size_t queue_length() const;
  size_t running() const;
  uint64_t decode_steps() const { return decode_steps_.load(); }  // batched passes so far
  uint64_t decode_rows() const { return decode_rows_.load(); }    // sequences in them, summed
  uint64_t prefill_pieces() const { return prefill_pieces_.load(); }  // pauses of a split pass
  size_t last_piece_rows() const { return last_piece_rows_.load(); }  // rows of the latest piece asked for
  uint64_t cancelled_jobs() const { return cancelled_jobs_.load(); }  // left because cancel was set
  size_t kv_reserved_bytes() const { return budget_->reserved_bytes(); }  // of the jobs prefilling or decoding
  size_t kv_budget_bytes() const { return budget_->budget_bytes(); }

 private:
  void loop();
  void start_one(SchedulerJob& job);
  void between_passes(std::span<const int32_t> done);
  void pause_prefill();
  size_t next_piece_rows(std::span<const int32_t> positions);
  void decode_step();
  void finish(SchedulerJob& job);
  void finish_cancelled(SchedulerJob& job);
  std::vector<SchedulerJob*> take_cancelled(std::deque<SchedulerJob*>& jobs);
  std::deque<SchedulerJob*>::iterator next_waiting();
  void fail_all(std::exception_ptr e);

  Forward& fwd_;
  SchedulerOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<SchedulerJob*> waiting_;
  struct Task {
    const std::function<void(Forward&)>* fn;
    std::exception_ptr error;
    bool done = false;
  };
  std::deque<Task*> tasks_;
  std::deque<std::function<void(Forward&)>> idle_tasks_;
  std::atomic<uint64_t> idle_tasks_run_{0};
  std::function<bool(Forward&)> idle_worker_;  // guarded by mu_ (set before work arrives)
  bool idle_worker_ready_ = false;             // guarded by mu_
  std::vector<SchedulerJob*> running_;  // scheduler thread only (size mirrored in n_running_)
  SchedulerJob* prefilling_ = nullptr;  // scheduler thread only: the job in job.prefill
  PrefillPieceSizer pieces_;            // scheduler thread only
  SchedulerJob::Clock::time_point piece_start_;  // of the piece in progress (scheduler thread)
  SchedulerJob::Clock::time_point last_token_at_;  // the running requests' latest token (scheduler thread)
  std::atomic<size_t> last_piece_rows_{0};
  size_t n_running_ = 0;                // guarded by mu_
  std::unique_ptr<KvBudget> own_budget_;  // when SchedulerOptions::kv_budget is null
  KvBudget* budget_ = nullptr;            // reservations: taken and released under mu_
  bool stopping_ = false;
  std::atomic<uint64_t> decode_steps_{0}, decode_rows_{0}, prefill_pieces_{0}, cancelled_jobs_{0};
  std::thread thread_;
};

}  // namespace cf

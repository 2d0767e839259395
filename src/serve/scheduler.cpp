#include "serve/scheduler.h"

#include "serve/request.h"

#include <algorithm>
#include <numeric>

#include "base/clock.h"
#include "base/enum_names.h"

namespace cf {

namespace {
constexpr EnumName<SchedulerOrder> kOrderNames[] = {
    {SchedulerOrder::fifo, "fifo"}, {SchedulerOrder::priority, "priority"}, {SchedulerOrder::shortest, "shortest"}};
}  // namespace

bool parse_scheduler_order(const std::string& name, SchedulerOrder& out) {
  return parse_enum_name(kOrderNames, name, out);
}

RequestError client_gone_error() {
  return RequestError(kClientGoneStatus, "cancelled", "the client closed the connection");
}

Scheduler::Scheduler(Forward& fwd, SchedulerOptions opt)
    : fwd_(fwd), opt_(opt), pieces_(opt.itl_target_ms, std::min(opt.prefill_chunk, Forward::kMaxPassRows)) {
  if (opt_.max_batch == 0) opt_.max_batch = 1;
  if (!opt_.kv_budget) own_budget_ = std::make_unique<KvBudget>(opt_.kv_budget_bytes);
  budget_ = opt_.kv_budget ? opt_.kv_budget : own_budget_.get();
  fwd_.set_pass_split({opt_.prefill_chunk, [this](std::span<const int32_t> done) { between_passes(done); },
                       [this](std::span<const int32_t> left) { return next_piece_rows(left); },
                       [this] { pause_prefill(); }});
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
  fwd_.set_pass_split({});
}

void Scheduler::submit(SchedulerJob& job) {
  job.arrival = SchedulerJob::Clock::now();
  const size_t budget = budget_->budget_bytes();
  if (budget && job.kv_bytes > budget)
    throw RequestError(413, "invalid_request_error",
                       "the request needs " + std::to_string(job.kv_bytes >> 20) + " MiB of K/V (prompt + max_tokens), " +
                           "more than this server's " + std::to_string(budget >> 20) +
                           " MiB (serve --kv-budget); ask for fewer max_tokens or send a shorter prompt",
                       "max_tokens");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw RequestError(503, "server_error", "the engine is shutting down");
    if (waiting_.size() >= opt_.max_queue)
      throw RequestError(503, "server_error",
                         "request queue full (" + std::to_string(opt_.max_queue) + " waiting); retry later");
    job.done = false;
    waiting_.push_back(&job);
  }
  work_cv_.notify_all();
}

void Scheduler::wait(SchedulerJob& job, const std::function<bool()>& client_gone) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!done_cv_.wait_for(lock, std::chrono::milliseconds(kCancelPollMs), [&] { return job.done; })) {
    if (!client_gone || job.cancel) continue;
    lock.unlock();  // the probe may take a moment (a poll on a socket)
    const bool gone = client_gone();
    lock.lock();
    if (gone) {
      job.cancel = true;
      work_cv_.notify_all();
    }
  }
  if (job.error) std::rethrow_exception(job.error);
}

void Scheduler::call(const std::function<void(Forward&)>& fn) {
  Task task{&fn, nullptr, false};
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) throw RequestError(503, "server_error", "the engine is shutting down");
    tasks_.push_back(&task);
    work_cv_.notify_all();
    done_cv_.wait(lock, [&] { return task.done; });
  }
  if (task.error) std::rethrow_exception(task.error);
}

void Scheduler::post_idle(std::function<void(Forward&)> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (idle_tasks_.size() >= kMaxIdleTasks) idle_tasks_.pop_front();
    idle_tasks_.push_back(std::move(fn));
  }
  work_cv_.notify_all();
}

void Scheduler::set_idle_worker(std::function<bool(Forward&)> step) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_worker_ = std::move(step);
}

void Scheduler::wake_idle_worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_worker_ready_ = static_cast<bool>(idle_worker_);
  }
  work_cv_.notify_all();
}

size_t Scheduler::queue_length() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.size();
}

size_t Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_running_;
}

// Jobs of `jobs` whose cancel is set, taken out (caller holds mu_).
std::vector<SchedulerJob*> Scheduler::take_cancelled(std::deque<SchedulerJob*>& jobs) {
  std::vector<SchedulerJob*> out;
  for (auto it = jobs.begin(); it != jobs.end();)
    if ((*it)->cancel) {
      out.push_back(*it);
      it = jobs.erase(it);
    } else {
      ++it;
    }
  return out;
}

// The job to prefill next (caller holds mu_; waiting_ is not empty): the oldest one past the age
// bound, else the first in the order (waiting_ is in arrival order, so ties go to the oldest).
std::deque<SchedulerJob*>::iterator Scheduler::next_waiting() {
  if (opt_.order == SchedulerOrder::fifo) return waiting_.begin();
  const auto now = SchedulerJob::Clock::now();
  if (now - waiting_.front()->arrival >= std::chrono::milliseconds(opt_.max_wait_ms)) return waiting_.begin();
  auto before = [&](const SchedulerJob* a, const SchedulerJob* b) {
    return opt_.order == SchedulerOrder::priority ? a->priority < b->priority : a->work < b->work;
  };
  return std::min_element(waiting_.begin(), waiting_.end(), before);
}

void Scheduler::finish_cancelled(SchedulerJob& job) {
  ++cancelled_jobs_;
  job.error = std::make_exception_ptr(client_gone_error());
  finish(job);
}

void Scheduler::loop() {
  for (;;) {
    std::deque<Task*> tasks;
    SchedulerJob* next = nullptr;
    std::function<void(Forward&)> idle;
    std::vector<SchedulerJob*> cancelled;
    std::function<bool(Forward&)> worker;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] {
        return stopping_ || !tasks_.empty() || !waiting_.empty() || !running_.empty() || !idle_tasks_.empty() ||
               idle_worker_ready_;
      });
      if (stopping_) break;
      cancelled = take_cancelled(waiting_);  // never prefilled: their clients are gone
      tasks.swap(tasks_);
      if (running_.size() < opt_.max_batch && !waiting_.empty()) {
        auto it = next_waiting();
        // Room for its K/V beside the running jobs' reservations, the caches giving back what
        // it needs (serve/kv_budget.h); else it keeps its place until a running job finishes
        // (with nothing running every job fits: submit refused the ones larger than the budget,
        // and the caches can give back all they hold).
        if (budget_->try_reserve((*it)->kv_bytes)) {
          next = *it;
          waiting_.erase(it);
          next->kv_reserved = true;
        }
      }
      // No request waits: background work delays only the running requests' next decode
      // step, as admitting a new request would.
      if (tasks.empty() && !next && waiting_.empty() && !idle_tasks_.empty()) {
        idle = std::move(idle_tasks_.front());
        idle_tasks_.pop_front();
      }
      // Nothing else at all: one step of the idle worker.
      if (tasks.empty() && !next && !idle && waiting_.empty() && running_.empty() && idle_worker_ready_) {
        idle_worker_ready_ = false;
        worker = idle_worker_;
      }
    }
    for (SchedulerJob* j : cancelled) finish_cancelled(*j);
    if (idle) {
      try {
        idle(fwd_);
      } catch (...) {  // background work: a failure costs a later cache miss, nothing more
      }
      ++idle_tasks_run_;
      continue;
    }
    if (worker) {
      bool more = false;
      try {
        more = worker(fwd_);
      } catch (...) {  // background work: the worker keeps its own account of what failed
      }
      if (more) {
        std::lock_guard<std::mutex> lock(mu_);
        idle_worker_ready_ = true;
      }
      continue;
    }
    for (Task* t : tasks) {
      try {
        (*t->fn)(fwd_);
      } catch (...) {
        t->error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      t->done = true;
      done_cv_.notify_all();
    }
    if (next) start_one(*next);
    if (!running_.empty()) decode_step();
  }
  fail_all(std::make_exception_ptr(RequestError(503, "server_error", "the engine is shutting down")));
}

// Prefill, then the first token (chosen from the prefill's logits, no decode pass needed).
void Scheduler::start_one(SchedulerJob& job) {
  job.started = SchedulerJob::Clock::now();
  try {
    prefilling_ = &job;
    struct Done {
      SchedulerJob*& p;
      ~Done() { p = nullptr; }
    } done{prefilling_};
    PrefillOutput p = job.prefill(fwd_);
    job.cache.emplace(std::move(p.cache));
    job.next_position = p.next_position;
    job.session.emplace(fwd_.model().tokenizer(), job.generate, job.history);
    if (!job.session->finished()) job.session->step(p.logits.data(), p.logits.size());
    job.first_token = job.last_token = SchedulerJob::Clock::now();
  } catch (...) {
    if (job.cancel) ++cancelled_jobs_;
    job.error = std::current_exception();
    finish(job);
    return;
  }
  if (job.session->finished()) {
    finish(job);
    return;
  }
  if (running_.empty()) last_token_at_ = job.first_token;  // the streams' gap clock starts
  running_.push_back(&job);
  std::lock_guard<std::mutex> lock(mu_);
  n_running_ = running_.size();
}

// Between two pieces of a split pass (Forward::PassSplit): the piece's cost is measured for the
// piece sizer, then the pause.
void Scheduler::between_passes(std::span<const int32_t> done) {
  pieces_.record_piece(done.size(), std::accumulate(done.begin(), done.end(), 0.0), ms_since(piece_start_));
  pause_prefill();
}

// Between two pieces, or two runs of layers of a pass with hooks (those are not measured: a
// hook's own work, such as capturing attention, would be counted as rows' cost): a prefilling
// job whose client is gone stops here; otherwise every running request decodes one token.
void Scheduler::pause_prefill() {
  ++prefill_pieces_;
  if (prefilling_ && prefilling_->cancel) throw client_gone_error();
  if (!running_.empty()) decode_step();
}

// Asked by the Forward pass before each piece of a split pass (Forward::PassSplit::next_rows).
size_t Scheduler::next_piece_rows(std::span<const int32_t> positions) {
  size_t demand = running_.size() + 1;  // and the one prefilling
  {
    std::lock_guard<std::mutex> lock(mu_);
    demand += waiting_.size();
  }
  const size_t rows =
      pieces_.next_rows(positions, running_.size(), std::min(demand, opt_.max_batch), ms_since(last_token_at_));
  last_piece_rows_ = rows;
  piece_start_ = SchedulerJob::Clock::now();
  return rows;
}

void Scheduler::decode_step() {
  if (std::any_of(running_.begin(), running_.end(), [](const SchedulerJob* j) { return j->cancel.load(); })) {
    std::vector<SchedulerJob*> live, gone;
    for (SchedulerJob* j : running_) (j->cancel ? gone : live).push_back(j);
    running_.swap(live);
    {
      std::lock_guard<std::mutex> lock(mu_);
      n_running_ = running_.size();
    }
    for (SchedulerJob* j : gone) finish_cancelled(*j);
    if (running_.empty()) return;
  }
  std::vector<BatchSequence> seqs(running_.size());
  std::vector<TokenId> tokens(running_.size());
  std::vector<int32_t> positions(running_.size());
  static const size_t kRow0 = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    SchedulerJob& j = *running_[i];
    tokens[i] = j.session->last_token();
    positions[i] = j.next_position++;
    seqs[i].cache = &*j.cache;
    seqs[i].input = ForwardInput{std::span<const TokenId>(&tokens[i], 1), std::span<const int32_t>(&positions[i], 1),
                                 {}, std::span<const size_t>(&kRow0, 1), WeightMatrix::KQuantOrder::PerRow};
  }
  std::vector<ForwardOutput> outs;
  ++decode_steps_;
  decode_rows_ += seqs.size();
  try {
    const auto t0 = SchedulerJob::Clock::now();
    outs = fwd_.run_batch(seqs);
    pieces_.record_decode(seqs.size(), ms_since(t0));
  } catch (...) {
    // A failed pass leaves every running cache in doubt: fail them all.
    auto e = std::current_exception();
    std::vector<SchedulerJob*> failed;
    failed.swap(running_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      n_running_ = 0;
    }
    for (SchedulerJob* j : failed) {
      j->error = e;
      finish(*j);
    }
    return;
  }
  std::vector<SchedulerJob*> still, ended;
  const auto now = SchedulerJob::Clock::now();
  last_token_at_ = now;
  for (size_t i = 0; i < running_.size(); ++i) {
    SchedulerJob& j = *running_[i];
    bool more = false;
    j.token_gaps_ms.push_back(std::chrono::duration<float, std::milli>(now - j.last_token).count());
    j.last_token = now;
    try {
      more = j.session->step(outs[i].logits.data(), outs[i].vocab);
    } catch (...) {
      j.error = std::current_exception();
    }
    (more ? still : ended).push_back(&j);
  }
  running_.swap(still);
  {
    // Before the waiters wake, so that a finished request is no longer counted as running.
    std::lock_guard<std::mutex> lock(mu_);
    n_running_ = running_.size();
  }
  for (SchedulerJob* j : ended) finish(*j);
}

void Scheduler::finish(SchedulerJob& job) {
  job.finished = SchedulerJob::Clock::now();
  if (!job.error && job.on_finish) {
    try {
      job.on_finish(job);
    } catch (...) {
      job.error = std::current_exception();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (job.kv_reserved) budget_->release(job.kv_bytes);
  job.kv_reserved = false;
  job.done = true;
  done_cv_.notify_all();
}

void Scheduler::fail_all(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(mu_);
  for (SchedulerJob* j : running_) {
    j->error = e;
    j->done = true;
    if (j->kv_reserved) budget_->release(j->kv_bytes);
    j->kv_reserved = false;
  }
  for (SchedulerJob* j : waiting_) {
    j->error = e;
    j->done = true;
  }
  for (Task* t : tasks_) {
    t->error = e;
    t->done = true;
  }
  running_.clear();
  waiting_.clear();
  tasks_.clear();
  n_running_ = 0;
  done_cv_.notify_all();
}

}  // namespace cf

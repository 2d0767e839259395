#include "serve/scheduler.h"

#include "serve/request.h"

namespace cf {

Scheduler::Scheduler(Forward& fwd, SchedulerOptions opt) : fwd_(fwd), opt_(opt) {
  if (opt_.max_batch == 0) opt_.max_batch = 1;
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void Scheduler::submit(SchedulerJob& job) {
  job.arrival = SchedulerJob::Clock::now();
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

void Scheduler::wait(SchedulerJob& job) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return job.done; });
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

size_t Scheduler::queue_length() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.size();
}

size_t Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_running_;
}

void Scheduler::loop() {
  for (;;) {
    std::deque<Task*> tasks;
    SchedulerJob* next = nullptr;
    std::function<void(Forward&)> idle;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] {
        return stopping_ || !tasks_.empty() || !waiting_.empty() || !running_.empty() || !idle_tasks_.empty();
      });
      if (stopping_) break;
      tasks.swap(tasks_);
      if (running_.size() < opt_.max_batch && !waiting_.empty()) {
        next = waiting_.front();
        waiting_.pop_front();
      }
      // No request waits: background work delays only the running requests' next decode
      // step, as admitting a new request would.
      if (tasks.empty() && !next && waiting_.empty() && !idle_tasks_.empty()) {
        idle = std::move(idle_tasks_.front());
        idle_tasks_.pop_front();
      }
    }
    if (idle) {
      try {
        idle(fwd_);
      } catch (...) {  // background work: a failure costs a later cache miss, nothing more
      }
      ++idle_tasks_run_;
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
    PrefillOutput p = job.prefill(fwd_);
    job.cache.emplace(std::move(p.cache));
    job.next_position = p.next_position;
    job.session.emplace(fwd_.model().tokenizer(), job.generate, job.history);
    if (!job.session->finished()) job.session->step(p.logits.data(), p.logits.size());
    job.first_token = SchedulerJob::Clock::now();
  } catch (...) {
    job.error = std::current_exception();
    finish(job);
    return;
  }
  if (job.session->finished()) {
    finish(job);
    return;
  }
  running_.push_back(&job);
  std::lock_guard<std::mutex> lock(mu_);
  n_running_ = running_.size();
}

void Scheduler::decode_step() {
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
    outs = fwd_.run_batch(seqs);
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
  for (size_t i = 0; i < running_.size(); ++i) {
    SchedulerJob& j = *running_[i];
    bool more = false;
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
  job.done = true;
  done_cv_.notify_all();
}

void Scheduler::fail_all(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(mu_);
  for (SchedulerJob* j : running_) {
    j->error = e;
    j->done = true;
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

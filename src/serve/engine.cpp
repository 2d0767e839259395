// The serving engine: on the caller's thread a request is validated, laid out, ordered by
// CRAFT and planned (serve/request_plan.h: which chunks join the exact prefix S', which are
// fused, what to prefetch and to promote); the scheduler thread then runs the plan: one
// FusionExecutor prefill (docs/ARCHITECTURE.md's layout S c1..cm U) and batched decoding. What a request
// keeps for the next turn of its conversation is serve/conversation_memory.h's; the counts it
// reports are serve/token_accounting.h's; registered chunks are serve/chunk_registry.h's.
#include "serve/engine.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>

#include "base/clock.h"
#include "base/paths.h"
#include "base/progress.h"
#include "base/thread_pool.h"
#include "fusion/cost_model.h"
#include "fusion/executor.h"
#include "kv/chunk_cache.h"
#include "kv/store_paths.h"
#include "model/model.h"
#include "runtime/forward.h"
#include "serve/chunk_registry.h"
#include "serve/conversation_memory.h"
#include "serve/craft.h"
#include "serve/disk_budget.h"
#include "serve/fusion_trace.h"
#include "serve/kv_budget.h"
#include "serve/passage_matching.h"
#include "serve/prefix_cache.h"
#include "serve/prompt_layout.h"
#include "serve/request_metrics.h"
#include "serve/request_plan.h"
#include "serve/scheduler.h"
#include "serve/self_check.h"
#include "serve/token_accounting.h"

namespace cf {
namespace {

using OnText = std::function<bool(std::string_view)>;
using ClientGone = std::function<bool()>;

// The prefix source of a fused request that opts out of the prefix cache: S computed for
// this request and dropped after it.
class UncachedPrefix : public PrefixSource {
 public:
  std::shared_ptr<const KvCache> prefix(Forward& fwd, std::span<const TokenId> tokens, size_t& hit_tokens) override {
    hit_tokens = 0;
    auto kv = std::make_shared<KvCache>(fwd.model().hparams(), tokens.size());
    extend_prefix(fwd, *kv, tokens);
    return kv;
  }
};

// Temp files a killed writer left in the store (kv/store_paths.h), before anything reads it.
void remove_stale_temp_files_of(const std::string& dir) {
  const size_t n = remove_stale_temp_files(dir, std::filesystem::file_time_type::clock::now());
  if (n) std::fprintf(stderr, "chunkfuse serve: removed %zu stale temp files left in %s by a killed writer\n", n, dir.c_str());
}

// serve --disk-budget, or the default for the store's file system now (serve/disk_budget.h),
// said on stderr.
size_t resolve_disk_budget(size_t given, const std::string& dir) {
  if (given != kDiskBudgetDefault) return given;
  const size_t budget = default_disk_budget(dir);
  std::fprintf(stderr,
               "chunkfuse serve: disk tier budget %s (the default: half the free space of %s plus the store's files, "
               "16 MiB to 10 GiB; --disk-budget sets it)\n",
               format_bytes(static_cast<double>(budget)).c_str(), dir.c_str());
  return budget;
}

std::string model_name_of(const Model& model, const std::string& path) {
  if (auto n = model.file().get_string("general.name"); n && !n->empty()) return std::string(*n);
  return std::filesystem::path(path).stem().string();
}

}  // namespace

struct Engine::Impl {
  // One request on the scheduler: its job and what the prefill and decoding leave behind.
  struct Run {
    SchedulerJob job;
    std::optional<FusionResult> fusion;  // the executor's facts (its logits and cache went to decoding)
    bool cancelled = false;              // on_text returned false
    TokenId fused_first = -1;            // top-1 of the prefill's logits (the self-check's)
    nlohmann::json self_check;           // the self-check's note (CompletionResult::self_check)
  };

  explicit Impl(EngineOptions o)
      : opt(std::move(o)),
        model(Model::load(opt.model_path)),
        pool(opt.threads > 0 ? static_cast<size_t>(opt.threads) : 0),
        fwd(*model, pool),
        kv_budget(resolve_kv_budgets(opt.kv_budget_bytes, opt.chunk_memory_bytes, opt.prefix_cache_bytes)),
        store(store_options()),
        prefixes(model->hparams(),
                 PrefixCacheOptions{16, opt.prefix_cache_bytes,
                                    &kv_budget.add_cache("prefix_cache",
                                                         [this](size_t n) { return prefixes.release(n); })}),
        conversations(craft, 10000, opt.conversation_bytes),
        registry(opt.cache_dir + "/serve-chunks.json", [this](const std::string& text) { return chunk_of(text); },
                 opt.registry_budget_bytes),
        gate(opt.max_tokenizing, std::chrono::milliseconds(opt.tokenize_wait_ms), "tokenizing their prompts"),
        name(model_name_of(*model, opt.model_path)) {
    const auto ctx = static_cast<size_t>(model->hparams().context_length);
    if (opt.max_prompt_tokens == 0 || opt.max_prompt_tokens > ctx) opt.max_prompt_tokens = ctx;
    // serve --ttft-ms: this machine's cost model is measured now, not on the first request.
    if (opt.default_fusion.ttft_ms > 0) {
      const autoq::CostModel c = autoq::shared_cost_model(fwd).get();
      std::fprintf(stderr, "chunkfuse serve: cost model for --ttft-ms: %.2f ms a pass + %.4f ms a row and layer\n",
                   c.fixed_ms, c.ms_per_row_layer);
    }
    SchedulerOptions so{opt.max_queue, opt.max_batch, opt.prefill_chunk};
    if (!parse_scheduler_order(opt.schedule, so.order))
      throw std::runtime_error("unknown schedule \"" + opt.schedule + "\" (fifo, priority, shortest)");
    so.max_wait_ms = opt.max_wait_ms;
    so.itl_target_ms = opt.itl_target_ms;
    so.kv_budget = &kv_budget;
    std::fprintf(stderr, "%s\n", kv_budget_line(opt.kv_budget_bytes, KvCache::bytes_per_entry(model->hparams()),
                                                opt.chunk_memory_bytes, opt.prefix_cache_bytes).c_str());
    scheduler = std::make_unique<Scheduler>(fwd, so);
    self_check = std::make_unique<SelfCheck>(*scheduler, model->tokenizer(),
                                             SelfCheckOptions{opt.self_check_share, 8, opt.prefill_chunk, {}},
                                             calibration_to_check(model->fingerprint_hex(), opt.self_check_share));
  }

  ChunkStoreOptions store_options() {
    if (opt.cache_dir.empty()) opt.cache_dir = cache_root() + "/serve-store";
    create_private_directories(opt.cache_dir);
    remove_stale_temp_files_of(opt.cache_dir);
    ChunkStoreOptions so;
    so.dir = opt.cache_dir;
    so.memory_budget_bytes = opt.chunk_memory_bytes;
    so.memory_account = &kv_budget.add_cache("chunk_store", [this](size_t n) { return store.release_memory(n); });
    so.durable = false;  // atomic either way; a crash only costs recomputes
    so.model = StoreModel{model->fingerprint(), model->hparams()};
    if (!parse_eviction_policy(opt.chunk_eviction, so.eviction))
      throw std::runtime_error("unknown chunk eviction policy \"" + opt.chunk_eviction + "\" (lru, cachecraft)");
    so.disk_budget_bytes = opt.chunk_disk_bytes = resolve_disk_budget(opt.chunk_disk_bytes, opt.cache_dir);
    so.max_entries = opt.max_chunk_entries;
    so.auth = EntryAuth::optional_from_key_file(opt.store_key_file);
    so.remote = opt.remote;
    return so;
  }

  ChunkKey key_of(const std::vector<TokenId>& tokens) const { return ChunkKey(model->fingerprint(), tokens); }
  RegisteredChunk chunk_of(const std::string& text) const {
    RegisteredChunk c{"", text, model->tokenizer().encode(document_chunk_text(text), false, false)};
    c.id = key_of(c.tokens).id();
    return c;
  }

  PlanLimits limits() const {
    return {static_cast<size_t>(model->hparams().context_length), opt.max_prompt_tokens, opt.max_documents,
            default_chat_stops(model->chat_template()), opt.max_variants};
  }

  // Documents, then S and U around them (a continued conversation's kept tokens first).
  PromptLayout lay_out(const CompletionRequest& req) {
    PromptLayout l;
    registry.lay_out_documents(req.documents, l);
    std::optional<std::vector<TokenId>> history;
    if (req.chat && !req.inline_passages && !req.fusion.conversation_id.empty())
      history = conversations.continued(req.fusion.conversation_id, req.messages);
    lay_out_prompt(model->tokenizer(), model->chat_template(), req, history ? &*history : nullptr, l);
    return l;
  }

  // CRAFT: frequency order, conversation dedup, the chunk prefix worth keeping exact.
  CraftPlan order_chunks(const CompletionRequest& req, const PromptLayout& l) {
    if (!wants_craft(req, l)) return request_order(l.chunks.size());
    const bool conversation = req.chat && !req.fusion.conversation_id.empty();
    return craft.plan(l.chunk_ids, conversation ? req.fusion.conversation_id : std::string(), req.fusion.reorder);
  }

  // The scheduler job of a plan: the executor's prefill, decoding, the turn kept at the end.
  void prepare(Run& run, const CompletionRequest& req, const RequestPlan& plan, const OnText& on_text) {
    SchedulerJob& job = run.job;
    job.generate = plan.generate;
    if (on_text)
      job.generate.on_text = [&run, &on_text](std::string_view s) {
        if (run.cancelled) return false;
        if (!on_text(s)) run.cancelled = true;
        return !run.cancelled;
      };
    job.history = plan.rag.flatten();
    job.priority = req.priority;
    job.work = expected_prefill_rows(plan);
    job.kv_bytes = (plan.prompt_tokens + static_cast<size_t>(std::max(0, plan.generate.max_tokens))) *
                   KvCache::bytes_per_entry(model->hparams());
    job.prefill = [this, &run, &plan](Forward& fw) {
      PrefixSource* source = plan.prefix_cache ? static_cast<PrefixSource*>(&prefixes) : (plan.fused ? &uncached : nullptr);
      // Priced: the client waits for cold chunk caches (fusion/auto_quality.h). The auto policy
      // answers with the calibration as the self-check left it.
      FusionExecutor ex(fw, store, source, ColdChunks::priced);
      const auto cal = self_check->calibration();
      ex.set_calibration(cal.get());
      FusionResult fr = ex.prefill(plan.rag, plan.fusion);
      if (self_check->enabled()) run.fused_first = top_token(fr.logits);
      PrefillOutput out{std::move(fr.logits), std::move(fr.cache), fr.next_position};
      run.fusion.emplace(std::move(fr));
      return out;
    };
    job.on_finish = [this, &req, &plan, &run](SchedulerJob& j) {
      end_turn(req, plan, j);
      if (run.fusion && !run.fusion->chunks_to_fill.empty()) fill_when_idle(std::move(run.fusion->chunks_to_fill));
      if (run.fusion) run.self_check = self_check->offer(plan, *run.fusion, *j.session, run.fused_first);
    };
  }

  // The chunk caches a prefill left cold (the auto policy answered with full prefill rather
  // than compute them first), computed after the answer when no request waits: one chunk per
  // idle turn, so that a request arriving meanwhile waits for one chunk at most.
  void fill_when_idle(std::vector<ChunkFill> fills) {
    if (fills.empty()) return;
    scheduler->post_idle([this, fills = std::move(fills)](Forward& fw) mutable {
      FusionExecutor(fw, store).fill({&fills.front(), 1});
      fills.erase(fills.begin());
      fill_when_idle(std::move(fills));
    });
  }

  // Scheduler thread, after the last step: the conversation's turn kept (or its dedup memory
  // cleared), and with a plain prefill the whole turn inserted in the prefix cache.
  void end_turn(const CompletionRequest& req, const RequestPlan& plan, SchedulerJob& j) {
    if (plan.conversation) {
      const std::string& why = j.session->stop_reason();
      const bool clean = why == "eos" || why == "length";
      KeptTurn turn;
      if (clean) {
        turn.messages = req.messages;
        turn.answer = j.session->text();
        turn.tokens = j.history;
        turn.tokens.insert(turn.tokens.end(), j.session->tokens().begin(), j.session->tokens().end());
        // The whole turn is exact only after a plain prefill: keep it for the next turn.
        if (!plan.fused && plan.prefix_cache) {
          const size_t n = std::min(turn.tokens.size(), j.cache->size());
          prefixes.insert(std::span<const TokenId>(turn.tokens).first(n), *j.cache);
        }
      }
      conversations.end_turn(plan.conversation_id, clean, std::move(turn));
    }
    metrics.set_prefix_cache_bytes(prefixes.stats().bytes);
  }

  // The exact K/V of a CRAFT prefix, computed when no request waits (request_plan.h).
  void promote_when_idle(std::vector<TokenId> tokens) {
    scheduler->post_idle([this, tokens = std::move(tokens)](Forward& fw) {
      size_t hit = 0;
      prefixes.prefix(fw, tokens, hit);
      metrics.set_prefix_cache_bytes(prefixes.stats().bytes);
    });
  }

  // The answer, its counts, timings and trace.
  CompletionResult result_of(const RequestPlan& plan, const Run& run, SteadyClock::time_point arrival) const {
    const DecodeSession& s = *run.job.session;
    const FusionResult& fr = *run.fusion;
    CompletionResult r;
    r.text = s.text();
    r.completion_tokens = s.tokens().size();
    r.cancelled = s.stop_reason() == "callback";
    r.finish_reason = s.stop_reason() == "length" ? "length" : "stop";
    r.history_tokens = plan.history_tokens;
    r.prompt_tokens = plan.prompt_tokens;
    r.chunk_order = plan.chunk_order;
    r.deduped_chunks = plan.deduped_chunks;
    static_cast<TokenCounts&>(r) = count_tokens(plan, fr);
    r.auto_choice = fr.auto_decision;
    CompletionTimings& t = r.timings;
    t.queue_ms = ms_between(run.job.arrival, run.job.started);
    t.lookup_ms = fr.timings.lookup_ms;
    t.load_ms = fr.timings.load_ms;
    t.selection_ms = fr.timings.selection_ms;
    t.recompute_ms = fr.timings.recompute_ms;
    t.ttft_ms = ms_between(arrival, run.job.first_token);
    t.decode_ms = ms_between(run.job.first_token, run.job.finished);
    r.trace = std::make_shared<FusionTrace>(make_fusion_trace(plan.fusion, model->hparams().n_layers, plan.rag,
                                                              plan.chunk_order, plan.exact_spans, fr));
    return r;
  }

  CompletionResult complete(const CompletionRequest& req, const OnText& on_text, const ClientGone& client_gone);

  EngineOptions opt;
  std::unique_ptr<Model> model;
  ThreadPool pool;
  Forward fwd;
  KvBudget kv_budget;  // serve --kv-budget: the reservations and the two caches below (before them)
  ChunkStore store;
  PrefixCache prefixes;  // scheduler thread only
  UncachedPrefix uncached;
  Craft craft;
  ConversationMemory conversations;  // uses craft
  ChunkRegistry registry;            // reads its index at start
  mutable BusyGate gate;             // caps the callers tokenizing at once
  RequestMetrics metrics;
  std::string name;
  std::unique_ptr<SelfCheck> self_check;  // the scheduler's idle worker: outlives its thread
  std::unique_ptr<Scheduler> scheduler;  // last: destroyed first, its thread uses the rest
};

// A request's story: validate, lay out, order (CRAFT), plan; then queue the plan, prefetch its
// chunks and promote CRAFT's prefix while it waits; then report what it did.
CompletionResult Engine::Impl::complete(const CompletionRequest& req, const OnText& on_text,
                                       const ClientGone& client_gone) {
  const auto arrival = SteadyClock::now();
  const PlanLimits lim = limits();
  validate_request(req, lim);
  const PromptLayout layout = [&] {
    const BusyGate::Slot slot = gate.enter();  // 503 server_busy when every slot stays taken
    return lay_out(req);
  }();
  // Too long even before dedup (which only a conversation can do): refuse before CRAFT
  // counts the request's chunks.
  if (!req.chat || req.fusion.conversation_id.empty()) check_prompt_fits(layout.tokens(), lim, req.chat);
  const CraftPlan order = order_chunks(req, layout);
  const RequestPlan plan = plan_request(req, layout, order, lim, req.seed ? 0 : std::random_device{}());

  Run run;
  prepare(run, req, plan, on_text);
  scheduler->submit(run.job);
  if (!plan.promote.empty()) promote_when_idle(plan.promote);
  // Cache-Craft §3.5: the chunk caches load from disk while the request waits in the queue
  // (on the store's worker; a get of a key being loaded waits for that load).
  if (plan.fetches_chunks()) FusionExecutor::prefetch(store, model->fingerprint(), plan.rag, plan.fusion);
  try {
    scheduler->wait(run.job, client_gone);
  } catch (...) {
    if (plan.conversation) conversations.forget(plan.conversation_id);
    throw;
  }
  CompletionResult result = result_of(plan, run, arrival);
  result.self_check = std::move(run.self_check);
  metrics.record(result);
  metrics.record_token_gaps(run.job.token_gaps_ms);
  return result;
}

Engine::Engine(EngineOptions opt) : impl_(std::make_unique<Impl>(std::move(opt))) {}
Engine::~Engine() = default;

CompletionResult Engine::complete(const CompletionRequest& req, const std::function<bool(std::string_view)>& on_text,
                                  const std::function<bool()>& client_gone) {
  try {
    CompletionResult r = impl_->complete(req, on_text, client_gone);
    if (req.inline_passages) r.passages = passages_report(*req.inline_passages, r);
    return r;
  } catch (const RequestError& e) {
    if (e.status == kClientGoneStatus)
      impl_->metrics.record_cancelled();
    else
      impl_->metrics.record_error();
    throw;
  } catch (const std::invalid_argument& e) {  // anything the layers below refuse
    impl_->metrics.record_error();
    throw invalid_request(e.what());
  } catch (...) {
    impl_->metrics.record_error();
    throw;
  }
}

std::vector<ChunkInfo> Engine::register_chunks(const std::vector<std::string>& texts,
                                               const std::function<bool()>& client_gone) {
  Impl& im = *impl_;
  if (texts.empty()) throw invalid_request("no texts to register", "input");
  if (texts.size() > im.opt.max_chunk_texts)
    throw invalid_request(std::to_string(texts.size()) + " texts; at most " + std::to_string(im.opt.max_chunk_texts) +
                              " per request (serve --max-chunk-texts)",
                          "input", 413);
  std::vector<RegisteredChunk> chunks;
  {
    const BusyGate::Slot slot = im.gate.enter();  // for the tokenizing, not the computing
    for (size_t i = 0; i < texts.size(); ++i) {
      if (texts[i].empty())
        throw invalid_request("text " + std::to_string(i) + " is empty", "input");
      chunks.push_back(im.chunk_of(texts[i]));
      if (chunks.back().tokens.size() + 1 > im.opt.max_prompt_tokens)
        throw invalid_request("text " + std::to_string(i) + " has " + std::to_string(chunks.back().tokens.size()) +
                               " tokens, more than a prompt may hold", "input", 413);
    }
  }
  // The caches need the forward pass, which the scheduler thread owns: one call per chunk, so
  // running streams decode between them instead of waiting for the whole list (issue 59).
  for (const auto& c : chunks) {
    if (client_gone && client_gone()) throw client_gone_error();
    im.scheduler->call([&](Forward& fw) {
      ChunkKey key = im.key_of(c.tokens);
      im.store.get_or_compute(key, [&] { return compute_chunk_cache(fw, key); });
    });
  }
  std::vector<ChunkInfo> infos;
  for (const auto& c : chunks) infos.push_back({c.id, c.tokens.size(), true, c.text});
  im.registry.add(std::move(chunks));
  return infos;
}

std::optional<ChunkInfo> Engine::chunk(const std::string& id) const {
  auto c = impl_->registry.find(id);
  if (!c) return std::nullopt;
  return ChunkInfo{id, c->tokens.size(), impl_->store.contains(impl_->key_of(c->tokens)), c->text};
}

const ChunkStore& Engine::chunk_store() const { return impl_->store; }
const ChunkRegistry& Engine::registry() const { return impl_->registry; }

// The cache first: on a full disk its file is what frees room for the index, and a chunk whose
// index entry could not be dropped (507) is still registered, its cache recomputed on use.
bool Engine::remove_chunk(const std::string& id) {
  const bool stored = impl_->store.remove(id);
  const bool known = impl_->registry.remove(id);
  return known || stored;
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m = impl_->metrics.snapshot();
  m.queue_length = impl_->scheduler->queue_length();
  m.running = impl_->scheduler->running();
  m.decode_steps = impl_->scheduler->decode_steps();
  m.decode_rows = impl_->scheduler->decode_rows();
  m.prefill_pieces = impl_->scheduler->prefill_pieces();
  m.prefill_piece_rows = impl_->scheduler->last_piece_rows();
  m.kv_reserved_bytes = impl_->scheduler->kv_reserved_bytes();
  m.kv_budget_bytes = impl_->kv_budget.budget_bytes();
  m.kv_cached_bytes = impl_->kv_budget.cached_bytes();
  m.kv_admission_evicted_bytes = impl_->kv_budget.admission_evicted_bytes();
  m.background_tasks = impl_->scheduler->idle_tasks_run();
  const ChunkStoreStats s = impl_->store.stats();
  m.store_memory_bytes = s.memory_bytes;
  m.store_disk_bytes = s.disk_bytes;
  m.store = s;
  m.conversations = impl_->conversations.size();
  m.conversation_bytes = impl_->conversations.bytes();
  m.self_check = impl_->self_check->snapshot();
  return m;
}

std::string Engine::model_name() const { return impl_->name; }
const EngineOptions& Engine::options() const { return impl_->opt; }
const Tokenizer& Engine::tokenizer() const { return impl_->model->tokenizer(); }
BusyGate& Engine::tokenize_gate() const { return impl_->gate; }

}  // namespace cf

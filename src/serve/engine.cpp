// The serving engine: validation and prompt layout on the caller's thread, CRAFT planning,
// then the scheduler thread runs one FusionExecutor prefill per request (DESIGN.md layout
// S c1..cm U) and batched decoding.
//
// How a request maps onto the executor (S' = the exact prefix, taken from the prefix cache):
//   full, no prefix cache      one plain prefill of S c1..cm U (the reference).
//   full + prefix cache        S' = S c1..cm (longest cached block prefix reused, the rest
//                              prefilled exactly and inserted), then U: vLLM APC-like.
//   full + prefix + reorder    S' = S + the CRAFT keep prefix; the other chunks are prefilled
//                              after it, not inserted (the CP-Tree decides what is kept).
//   method m                   S' = S (+ with reorder the CRAFT keep prefix, exact), the
//                              remaining chunks fused by method m at the ratio.
//   method m, no prefix cache  S computed for this request only, chunks fused.
//
// Conversations (fusion.conversation_id, chat only). After a turn that ends cleanly (EOS or
// the token limit) the engine keeps its messages, its answer and its tokens (prompt, with
// that turn's documents, plus the answer). The next request of the conversation continues
// it when its messages are exactly the kept ones, then {assistant: the kept answer}, then
// one user message: S is then the kept tokens + the template's text between the answer and
// the new user content, so earlier documents stay in the prompt, CRAFT's dedup drops the
// ones repeated, and the history hits the prefix cache (with "full" + prefix cache the whole
// turn, answer included, is inserted; with a fusion method only S' is, since fused K/V is
// not exact). Anything else (edited history, a turn that stopped on a stop string, was
// cancelled or failed) starts the conversation afresh: the history is rendered by the
// template without earlier documents and the dedup memory is cleared.
#include "serve/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <unordered_map>

#include "base/paths.h"
#include "base/thread_pool.h"
#include "fusion/executor.h"
#include "fusion/rag_prompt.h"
#include "kv/chunk_cache.h"
#include "kv/chunk_store.h"
#include "kv/store_paths.h"
#include "model/model.h"
#include "runtime/forward.h"
#include "serve/craft.h"
#include "serve/fusion_trace.h"
#include "serve/passage_matching.h"
#include "serve/prefix_cache.h"
#include "serve/scheduler.h"

namespace cf {
namespace {

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

RequestError invalid(const std::string& message, const std::string& param) {
  return RequestError(400, "invalid_request_error", message, param);
}

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

// The text a document becomes in its chunk: the same for inline and registered passages,
// so one passage has one id.
std::string document_chunk_text(const std::string& text) { return passage_text({"", text}, RagPromptOptions{}); }

const std::vector<double> kTtftBucketsMs = {50, 100, 250, 500, 1000, 2500, 5000, 10000};

}  // namespace

struct Engine::Impl {
  struct RegisteredChunk {
    std::string text;
    std::vector<TokenId> tokens;
  };
  struct Conversation {
    std::vector<ChatMessage> messages;  // the turn's request messages (last: its user message)
    std::string answer;
    std::vector<TokenId> tokens;        // prompt + answer tokens
    uint64_t last_used = 0;
  };
  // A request laid out, on the caller's thread.
  struct Layout {
    std::vector<TokenId> system;              // S
    std::vector<std::vector<TokenId>> chunks; // in request order
    std::vector<std::string> chunk_ids;
    std::vector<TokenId> suffix;              // U
    size_t history_tokens = 0;
  };

  explicit Impl(EngineOptions o)
      : opt(std::move(o)),
        model(Model::load(opt.model_path)),
        pool(opt.threads > 0 ? static_cast<size_t>(opt.threads) : 0),
        fwd(*model, pool),
        store(store_options()),
        prefixes(model->hparams(), PrefixCacheOptions{16, opt.prefix_cache_bytes}) {
    if (auto n = model->file().get_string("general.name"); n && !n->empty()) {
      name = std::string(*n);
    } else {
      name = std::filesystem::path(opt.model_path).stem().string();
    }
    const auto ctx = static_cast<size_t>(model->hparams().context_length);
    if (opt.max_prompt_tokens == 0 || opt.max_prompt_tokens > ctx) opt.max_prompt_tokens = ctx;
    metrics.ttft_bucket_bounds_ms = kTtftBucketsMs;
    metrics.ttft_bucket_counts.assign(kTtftBucketsMs.size() + 1, 0);
    load_index();
    scheduler = std::make_unique<Scheduler>(fwd, SchedulerOptions{opt.max_queue, opt.max_batch});
  }

  ChunkStoreOptions store_options() {
    if (opt.cache_dir.empty()) opt.cache_dir = cache_root() + "/serve-store";
    create_private_directories(opt.cache_dir);
    ChunkStoreOptions so;
    so.dir = opt.cache_dir;
    so.memory_budget_bytes = opt.chunk_memory_bytes;
    so.durable = false;  // atomic either way; a crash only costs recomputes
    so.model = StoreModel{model->fingerprint(), model->hparams()};
    if (!parse_eviction_policy(opt.chunk_eviction, so.eviction))
      throw std::runtime_error("unknown chunk eviction policy \"" + opt.chunk_eviction + "\" (lru, cachecraft)");
    so.disk_budget_bytes = opt.chunk_disk_bytes;
    so.max_entries = opt.max_chunk_entries;
    so.auth = EntryAuth::optional_from_key_file(opt.store_key_file);
    so.remote = opt.remote;
    return so;
  }

  // ---- registered chunks: id -> text, mirrored in a JSON index so ids survive restarts.
  std::string index_path() const { return opt.cache_dir + "/serve-chunks.json"; }

  std::vector<TokenId> chunk_tokens(const std::string& text) const {
    return model->tokenizer().encode(document_chunk_text(text), false, false);
  }
  ChunkKey key_of(const std::vector<TokenId>& tokens) const { return ChunkKey(model->fingerprint(), tokens); }

  void load_index() {
    std::ifstream in(index_path());
    if (!in) return;
    try {
      const auto j = nlohmann::json::parse(in);
      for (const auto& text : j.at("chunks")) {
        auto tokens = chunk_tokens(text.get<std::string>());
        const std::string id = key_of(tokens).id();  // recomputed: another model gives other ids
        registered[id] = {text.get<std::string>(), std::move(tokens)};
      }
    } catch (const std::exception& e) {
      throw std::runtime_error(index_path() + ": unreadable chunk index (" + e.what() + ")");
    }
  }

  void save_index_locked() const {
    nlohmann::json texts = nlohmann::json::array();
    for (const auto& [id, c] : registered) texts.push_back(c.text);
    // Document texts: a fresh 0600 temp file (O_EXCL|O_NOFOLLOW, never a planted link), fsync,
    // rename; the store's one atomic writer (issue 29 item 11).
    write_private_file_atomic(index_path(), nlohmann::json{{"version", 1}, {"chunks", texts}}.dump());
  }

  // ---- validation and layout (caller's thread).
  void validate(const CompletionRequest& req) const {
    const auto ctx = static_cast<size_t>(model->hparams().context_length);
    const FusionSpec& f = req.fusion;
    if (f.method != "full") {
      const auto names = selector_names();
      if (std::find(names.begin(), names.end(), f.method) == names.end()) {
        std::string known = "full";
        for (const auto& n : names) known += ", " + n;
        throw invalid("unknown fusion method \"" + f.method + "\" (known: " + known + ")", "fusion.method");
      }
      try {  // the method judges its options (api_json.cpp does too; this covers direct callers)
        make_selector(f.method)->configure(f.options);
      } catch (const std::invalid_argument& e) {
        throw invalid(std::string("fusion.options: ") + e.what(), "fusion.options");
      }
    }
    if (!(f.ratio >= 0.0 && f.ratio <= 1.0))
      throw invalid("fusion.ratio must be in [0, 1], got " + std::to_string(f.ratio), "fusion.ratio");
    if (req.max_tokens <= 0) throw invalid("max_tokens must be at least 1", "max_tokens");
    if (static_cast<size_t>(req.max_tokens) > ctx)
      throw invalid("max_tokens " + std::to_string(req.max_tokens) + " exceeds the context of " + std::to_string(ctx),
                    "max_tokens");
    if (!std::isfinite(req.temperature) || req.temperature < 0 || req.temperature > 2)
      throw invalid("temperature must be in [0, 2]", "temperature");
    if (!(req.top_p > 0 && req.top_p <= 1)) throw invalid("top_p must be in (0, 1]", "top_p");
    if (req.documents.size() > opt.max_documents)
      throw invalid(std::to_string(req.documents.size()) + " documents; at most " + std::to_string(opt.max_documents) +
                        " per request",
                    "documents");
    if (req.chat) {
      if (req.messages.empty()) throw invalid("messages must not be empty", "messages");
      for (size_t i = 0; i < req.messages.size(); ++i) {
        const auto& r = req.messages[i].role;
        if (r != "system" && r != "user" && r != "assistant")
          throw invalid("messages[" + std::to_string(i) + "].role must be system, user or assistant, got \"" + r + "\"",
                        "messages");
      }
      if (req.messages.back().role != "user") throw invalid("the last message must be a user message", "messages");
    } else if (req.prompt.empty()) {
      throw invalid("prompt must not be empty", "prompt");
    }
  }

  // Documents -> chunk token lists and ids (404 on an unregistered id).
  void add_documents(const CompletionRequest& req, Layout& l) const {
    std::lock_guard<std::mutex> lock(chunks_mu);
    for (size_t i = 0; i < req.documents.size(); ++i) {
      const DocumentRef& d = req.documents[i];
      if (!d.id.empty() && !d.text.empty())
        throw invalid("documents[" + std::to_string(i) + "] gives both text and id; give one", "documents");
      if (!d.id.empty()) {
        auto it = registered.find(d.id);
        if (it == registered.end())
          throw RequestError(404, "not_found_error", "unknown chunk id \"" + d.id + "\" (register it with POST /v1/chunks)",
                             "documents");
        l.chunks.push_back(it->second.tokens);
        l.chunk_ids.push_back(d.id);
      } else {
        if (d.text.empty()) throw invalid("documents[" + std::to_string(i) + "] is empty", "documents");
        l.chunks.push_back(chunk_tokens(d.text));
        l.chunk_ids.push_back(key_of(l.chunks.back()).id());
      }
    }
  }

  // The kept history when `req` continues its conversation, else nullopt (and the
  // conversation's dedup memory is cleared: its earlier documents are not in this prompt).
  std::optional<Conversation> continued_conversation(const CompletionRequest& req) {
    const std::string& cid = req.fusion.conversation_id;
    std::optional<Conversation> kept;
    {
      std::lock_guard<std::mutex> lock(conv_mu);
      auto it = conversations.find(cid);
      if (it != conversations.end()) {
        const Conversation& c = it->second;
        const auto& m = req.messages;
        const size_t k = c.messages.size();
        bool continues = m.size() == k + 2 && m[k].role == "assistant" && m[k].content == c.answer;
        for (size_t i = 0; continues && i < k; ++i)
          continues = m[i].role == c.messages[i].role && m[i].content == c.messages[i].content;
        if (continues) {
          it->second.last_used = ++conversation_clock;
          kept = c;
        } else {
          conversations.erase(it);
        }
      }
    }
    if (!kept) craft.forget_conversation(cid);
    return kept;
  }

  Layout layout(const CompletionRequest& req) {
    Layout l;
    const Tokenizer& tok = model->tokenizer();
    add_documents(req, l);
    if (req.inline_passages) {  // passages found in a plain message (serve/passage_matching.h)
      lay_out_inline_passages(tok, model->chat_template(), req, l.system, l.suffix);
      return l;
    }
    if (!req.chat) {
      std::vector<TokenId> prompt = tok.encode(req.prompt, true, false);
      if (prompt.empty()) throw invalid("prompt has no tokens", "prompt");
      if (l.chunks.empty()) {  // S = all but the last token, so the prefix cache can serve it
        l.suffix.assign(prompt.end() - 1, prompt.end());
        prompt.pop_back();
        l.system = std::move(prompt);
      } else {  // the documents go ahead of the prompt, after BOS when the model has one
        const bool bos = !prompt.empty() && prompt.front() == tok.bos() && tok.bos() >= 0;
        if (bos) l.system.push_back(prompt.front());
        l.suffix.assign(prompt.begin() + (bos ? 1 : 0), prompt.end());
        if (l.suffix.empty()) throw invalid("prompt has no tokens", "prompt");
      }
      return l;
    }
    const size_t last = req.messages.size() - 1;
    const std::string& question = req.messages[last].content;
    std::optional<Conversation> history;
    if (!req.fusion.conversation_id.empty()) history = continued_conversation(req);
    if (history) {
      // kept tokens, then the template's text between the answer and the new user content.
      // Every content is cut out of the rendering, so no message text (not even one that
      // spells a cut marker) can reach the pieces parsed for special tokens.
      std::vector<size_t> every(req.messages.size());
      std::iota(every.begin(), every.end(), size_t{0});
      const ChatTemplate& tmpl = model->chat_template();
      const auto pieces = render_prompt_around(tmpl, req.messages, every);
      l.system = history->tokens;
      l.history_tokens = l.system.size();
      const auto between = tok.encode(pieces[last], false, true);
      l.system.insert(l.system.end(), between.begin(), between.end());
      l.suffix = tok.encode(tmpl.from_file() ? tmpl.content_text(question) : question, false, false);
      const auto after = tok.encode(pieces[last + 1], false, true);
      l.suffix.insert(l.suffix.end(), after.begin(), after.end());
    } else {
      // Every message's content is text, never special tokens (issue 29, item 5).
      ChatPromptTokens t = encode_chat_prompt(tok, model->chat_template(), req.messages);
      l.system = std::move(t.before);
      l.suffix = std::move(t.content);
      l.suffix.insert(l.suffix.end(), t.after.begin(), t.after.end());
    }
    // A continued conversation's kept tokens were laid out the same way, and its answer is
    // the model's own tokens.
    return l;
  }

  RequestError prompt_too_long(size_t tokens, bool chat) const {
    return RequestError(413, "invalid_request_error",
                        "prompt of " + std::to_string(tokens) + " tokens leaves no room to answer under the limit of " +
                            std::to_string(opt.max_prompt_tokens) + " tokens",
                        chat ? "messages" : "prompt");
  }

  void record_metrics(const CompletionResult* r, bool error) {
    std::lock_guard<std::mutex> lock(metrics_mu);
    if (error) {
      ++metrics.errors;
      return;
    }
    ++metrics.requests;
    if (r->cancelled) ++metrics.cancelled;
    const double t = r->timings.ttft_ms;
    for (size_t b = 0; b < kTtftBucketsMs.size(); ++b)
      if (t <= kTtftBucketsMs[b]) ++metrics.ttft_bucket_counts[b];
    ++metrics.ttft_bucket_counts.back();
    metrics.ttft_sum_ms += t;
    ++metrics.ttft_count;
    metrics.prompt_tokens += r->prompt_tokens;
    metrics.completion_tokens += r->completion_tokens;
    metrics.prefilled_tokens += r->prefilled_tokens;
    metrics.prefix_hit_tokens += r->prefix_hit_tokens;
    metrics.chunk_hits += r->chunk_hits;
    metrics.chunk_misses += r->chunk_misses;
  }

  CompletionResult complete(const CompletionRequest& req, const std::function<bool(std::string_view)>& on_text);

  EngineOptions opt;
  std::unique_ptr<Model> model;
  ThreadPool pool;
  Forward fwd;
  ChunkStore store;
  PrefixCache prefixes;  // scheduler thread only
  UncachedPrefix uncached;
  Craft craft;
  std::string name;

  mutable std::mutex chunks_mu;
  std::map<std::string, RegisteredChunk> registered;
  std::atomic<uint64_t> registry_version{0};  // bumped when `registered` changes

  std::mutex conv_mu;
  std::unordered_map<std::string, Conversation> conversations;
  uint64_t conversation_clock = 0;
  static constexpr size_t kMaxConversations = 10000;

  mutable std::mutex metrics_mu;
  EngineMetrics metrics;  // counters and histogram; gauges filled in by metrics()
  size_t prefix_bytes = 0;  // last seen on the scheduler thread (guarded by metrics_mu)

  std::unique_ptr<Scheduler> scheduler;  // last: destroyed first, its thread uses the rest
};

CompletionResult Engine::Impl::complete(const CompletionRequest& req,
                                        const std::function<bool(std::string_view)>& on_text) {
  const auto arrival = Clock::now();
  validate(req);
  Layout l = layout(req);
  const FusionSpec& f = req.fusion;
  const bool fused = f.method != "full";
  const bool conversation = req.chat && !f.conversation_id.empty();

  // Too long even before dedup (which only a conversation can do): refuse before CRAFT
  // counts the request's chunks.
  size_t laid_out = l.system.size() + l.suffix.size();
  for (const auto& c : l.chunks) laid_out += c.size();
  if (!conversation && laid_out + 1 > opt.max_prompt_tokens) throw prompt_too_long(laid_out, req.chat);

  // CRAFT: frequency order, conversation dedup, the chunk prefix worth keeping exact.
  CompletionResult result;
  result.history_tokens = l.history_tokens;
  std::vector<size_t> order(l.chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  size_t keep_chunks = 0;
  size_t matched_chunks = 0;  // the CP-Tree's prefix before this request (<= keep_chunks)
  if (!l.chunks.empty() && (f.reorder || conversation)) {
    CraftPlan plan = craft.plan(l.chunk_ids, conversation ? f.conversation_id : std::string(), f.reorder);
    order = std::move(plan.order);
    result.deduped_chunks = plan.dropped.size();
    keep_chunks = std::min(plan.keep_chunks, order.size());
    matched_chunks = std::min(plan.matched_chunks, keep_chunks);
  }
  size_t exact_chunks = 0;  // leading chunks that join S' (exact, through the prefix cache)
  if (f.prefix_cache) exact_chunks = f.reorder ? keep_chunks : (fused ? 0 : order.size());
  // CRAFT + fusion: a newly promoted chunk prefix would be prefilled in full on this
  // request's critical path, though fusion serves those chunks cheaply. Only the prefix the
  // CP-Tree already held joins S' now; the promoted one is computed exactly when the
  // scheduler is idle, so later requests hit it (deviation from CRAFT, which has no fusion
  // and computes the promoted prefix anyway).
  std::vector<TokenId> promote;
  if (fused && f.reorder && f.prefix_cache && keep_chunks > matched_chunks) {
    promote = l.system;
    for (size_t k = 0; k < keep_chunks; ++k) promote.insert(promote.end(), l.chunks[order[k]].begin(), l.chunks[order[k]].end());
    exact_chunks = matched_chunks;
  }

  RagRequest rr;
  rr.system = l.system;
  std::vector<std::pair<size_t, size_t>> exact_spans;  // [begin, end) of each chunk in S'
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& c = l.chunks[order[k]];
    result.chunk_order.push_back(l.chunk_ids[order[k]]);
    if (k < exact_chunks) {
      exact_spans.emplace_back(rr.system.size(), rr.system.size() + c.size());
      rr.system.insert(rr.system.end(), c.begin(), c.end());
    } else {
      rr.chunks.push_back(c);
    }
  }
  rr.suffix = l.suffix;
  const size_t prompt_tokens = rr.system.size() + rr.context_tokens() + rr.suffix.size();
  result.prompt_tokens = prompt_tokens;
  if (prompt_tokens + 1 > opt.max_prompt_tokens) throw prompt_too_long(prompt_tokens, req.chat);

  FusionOptions fo;
  fo.method = f.method;
  fo.ratio = f.ratio;
  fo.method_options = f.options;
  fo.seed = req.seed.value_or(0);
  fo.chunk_variant = opt.default_chunk_variant;
  if (!f.chunk_variant.empty()) parse_chunk_variant(f.chunk_variant, fo.chunk_variant);  // checked when parsed
  SchedulerJob job;
  const auto ctx = static_cast<size_t>(model->hparams().context_length);
  job.generate.max_tokens = static_cast<int>(std::min<size_t>(req.max_tokens, ctx - prompt_tokens));
  job.generate.sampling.temperature = static_cast<float>(req.temperature);
  job.generate.sampling.top_p = static_cast<float>(req.top_p);
  job.generate.sampling.top_k = 0;    // OpenAI's API has neither top-k nor min-p
  job.generate.sampling.min_p = 0.0f;
  job.generate.sampling.seed = req.seed ? *req.seed : std::random_device{}();
  job.generate.stop = req.stop.empty() && req.chat ? default_chat_stops(model->chat_template()) : req.stop;
  bool cancelled = false;
  if (on_text)
    job.generate.on_text = [&](std::string_view s) {
      if (cancelled) return false;
      if (!on_text(s)) cancelled = true;
      return !cancelled;
    };
  job.history = rr.flatten();

  FusionResult fr_stats{{}, KvCache(model->hparams()), 0, {}, 0, 0, 0, false, 0, {}, {}, {}, {}};
  PrefixSource* source = f.prefix_cache ? static_cast<PrefixSource*>(&prefixes) : (fused ? &uncached : nullptr);
  job.prefill = [&](Forward& fw) {
    FusionExecutor executor(fw, store, source);
    FusionResult fr = executor.prefill(rr, fo);
    PrefillOutput out{std::move(fr.logits), std::move(fr.cache), fr.next_position};
    fr_stats = std::move(fr);
    return out;
  };
  job.on_finish = [&](SchedulerJob& j) {
    const std::string& why = j.session->stop_reason();
    const bool clean = why == "eos" || why == "length";
    if (conversation && clean) {
      Conversation c;
      c.messages = req.messages;
      c.answer = j.session->text();
      c.tokens = job.history;
      c.tokens.insert(c.tokens.end(), j.session->tokens().begin(), j.session->tokens().end());
      // The whole turn is exact only after a plain prefill: keep it for the next turn.
      if (!fused && f.prefix_cache) {
        const size_t n = std::min(c.tokens.size(), j.cache->size());
        prefixes.insert(std::span<const TokenId>(c.tokens).first(n), *j.cache);
      }
      std::lock_guard<std::mutex> lock(conv_mu);
      c.last_used = ++conversation_clock;
      conversations[f.conversation_id] = std::move(c);
      if (conversations.size() > kMaxConversations) {
        auto oldest = std::min_element(conversations.begin(), conversations.end(),
                                       [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
        conversations.erase(oldest);
      }
    }
    std::lock_guard<std::mutex> lock(metrics_mu);
    prefix_bytes = prefixes.stats().bytes;
  };

  scheduler->submit(job);
  if (!promote.empty())
    scheduler->post_idle([this, tokens = std::move(promote)](Forward& fw) {
      size_t hit = 0;
      prefixes.prefix(fw, tokens, hit);
      std::lock_guard<std::mutex> lock(metrics_mu);
      prefix_bytes = prefixes.stats().bytes;
    });
  // Cache-Craft §3.5: the request's chunk caches load from disk while it waits in the queue
  // (on the store's worker; a get of a key being loaded waits for that load).
  // The executor's own keys: what it prefetches is what its prefill looks up.
  if (fused && !rr.chunks.empty()) FusionExecutor::prefetch(store, model->fingerprint(), rr, fo);
  try {
    scheduler->wait(job);
  } catch (...) {
    if (conversation) {
      craft.forget_conversation(f.conversation_id);
      std::lock_guard<std::mutex> lock(conv_mu);
      conversations.erase(f.conversation_id);
    }
    throw;
  }

  const DecodeSession& s = *job.session;
  result.text = s.text();
  result.completion_tokens = s.tokens().size();
  result.cancelled = s.stop_reason() == "callback";
  result.finish_reason = s.stop_reason() == "length" ? "length" : "stop";
  if (conversation && s.stop_reason() != "eos" && s.stop_reason() != "length") {
    craft.forget_conversation(f.conversation_id);  // the turn is not kept (see the top)
  }

  // Token accounting. S' chunks count as hits when the prefix cache covered them.
  const size_t hit = fr_stats.prefix_hit_tokens;
  result.prefix_hit_tokens = hit;
  size_t exact_context_computed = 0;
  for (const auto& [b, e] : exact_spans) {
    if (e <= hit) {
      ++result.chunk_hits;
    } else {
      ++result.chunk_misses;
      exact_context_computed += e - std::max(b, hit);
    }
  }
  if (fused) {
    result.chunk_hits += fr_stats.chunk_hits;
    result.chunk_misses += fr_stats.chunk_misses;
    result.recomputed_tokens = exact_context_computed + fr_stats.recomputed.size();
    result.prefilled_tokens = rr.system.size() - hit + fr_stats.recomputed.size() + rr.suffix.size();
  } else {
    result.chunk_misses += rr.chunks.size();  // prefilled after S'
    result.recomputed_tokens = exact_context_computed + rr.context_tokens();
    result.prefilled_tokens = prompt_tokens - hit;
  }
  CompletionTimings& t = result.timings;
  t.queue_ms = ms_between(job.arrival, job.started);
  t.lookup_ms = fr_stats.timings.lookup_ms;
  t.load_ms = fr_stats.timings.load_ms;
  t.selection_ms = fr_stats.timings.selection_ms;
  t.recompute_ms = fr_stats.timings.recompute_ms;
  t.ttft_ms = ms_between(arrival, job.first_token);
  t.decode_ms = ms_between(job.first_token, job.finished);
  result.trace = std::make_shared<FusionTrace>(
      make_fusion_trace(f.method, model->hparams().n_layers, rr, result.chunk_order, exact_spans, fr_stats));
  record_metrics(&result, false);
  return result;
}

Engine::Engine(EngineOptions opt) : impl_(std::make_unique<Impl>(std::move(opt))) {}
Engine::~Engine() = default;

CompletionResult Engine::complete(const CompletionRequest& req, const std::function<bool(std::string_view)>& on_text) {
  try {
    CompletionResult r = impl_->complete(req, on_text);
    if (req.inline_passages) r.passages = passages_report(*req.inline_passages, r);
    return r;
  } catch (const RequestError&) {
    impl_->record_metrics(nullptr, true);
    throw;
  } catch (const std::invalid_argument& e) {  // anything the layers below refuse
    impl_->record_metrics(nullptr, true);
    throw RequestError(400, "invalid_request_error", e.what());
  } catch (...) {
    impl_->record_metrics(nullptr, true);
    throw;
  }
}

std::vector<ChunkInfo> Engine::register_chunks(const std::vector<std::string>& texts) {
  Impl& im = *impl_;
  if (texts.empty()) throw invalid("no texts to register", "input");
  std::vector<ChunkInfo> infos;
  std::vector<std::vector<TokenId>> tokens;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (texts[i].empty()) throw invalid("text " + std::to_string(i) + " is empty", "input");
    tokens.push_back(im.chunk_tokens(texts[i]));
    if (tokens.back().size() + 1 > im.opt.max_prompt_tokens)
      throw RequestError(413, "invalid_request_error",
                         "text " + std::to_string(i) + " has " + std::to_string(tokens.back().size()) +
                             " tokens, more than a prompt may hold",
                         "input");
    infos.push_back({im.key_of(tokens.back()).id(), tokens.back().size(), true, texts[i]});
  }
  // The caches need the forward pass, which the scheduler thread owns.
  im.scheduler->call([&](Forward& fw) {
    for (const auto& t : tokens) {
      ChunkKey key = im.key_of(t);
      im.store.get_or_compute(key, [&] { return compute_chunk_cache(fw, key); });
    }
  });
  std::lock_guard<std::mutex> lock(im.chunks_mu);
  for (size_t i = 0; i < texts.size(); ++i) im.registered[infos[i].id] = {texts[i], std::move(tokens[i])};
  ++im.registry_version;
  im.save_index_locked();
  return infos;
}

std::optional<ChunkInfo> Engine::chunk(const std::string& id) const {
  std::lock_guard<std::mutex> lock(impl_->chunks_mu);
  auto it = impl_->registered.find(id);
  if (it == impl_->registered.end()) return std::nullopt;
  return ChunkInfo{id, it->second.tokens.size(), impl_->store.contains(impl_->key_of(it->second.tokens)), it->second.text};
}

const ChunkStore& Engine::chunk_store() const { return impl_->store; }

std::vector<std::string> Engine::registered_texts() const {
  std::lock_guard<std::mutex> lock(impl_->chunks_mu);
  std::vector<std::string> out;
  out.reserve(impl_->registered.size());
  for (const auto& [id, c] : impl_->registered) out.push_back(c.text);
  return out;
}

uint64_t Engine::registry_version() const { return impl_->registry_version.load(); }

bool Engine::remove_chunk(const std::string& id) {
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(impl_->chunks_mu);
    known = impl_->registered.erase(id) > 0;
    if (known) {
      ++impl_->registry_version;
      impl_->save_index_locked();
    }
  }
  const bool stored = impl_->store.remove(id);
  return known || stored;
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(impl_->metrics_mu);
    m = impl_->metrics;
    m.prefix_cache_bytes = impl_->prefix_bytes;
  }
  m.queue_length = impl_->scheduler->queue_length();
  m.running = impl_->scheduler->running();
  m.decode_steps = impl_->scheduler->decode_steps();
  m.decode_rows = impl_->scheduler->decode_rows();
  m.background_tasks = impl_->scheduler->idle_tasks_run();
  const ChunkStoreStats s = impl_->store.stats();
  m.store_memory_bytes = s.memory_bytes;
  m.store_disk_bytes = s.disk_bytes;
  m.store = s;
  return m;
}

std::string Engine::model_name() const { return impl_->name; }
const EngineOptions& Engine::options() const { return impl_->opt; }
const Tokenizer& Engine::tokenizer() const { return impl_->model->tokenizer(); }

}  // namespace cf

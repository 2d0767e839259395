// HttpServer: cpp-httplib routes around Engine (see server.h). Each connection runs on one
// of httplib's pool threads, which blocks in Engine::complete while the engine schedules.
#include "serve/server.h"

#include "serve/engine.h"
#include "serve/key_isolation.h"
#include "serve/key_quota.h"
#include "serve/knowledge_routes.h"
#include "serve/passage_matching.h"
#include "serve/request_limits.h"
#include "serve/route_wrappers.h"
#include "serve/vllm_metrics.h"

#include <httplib.h>
#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <thread>

namespace cf {

using nlohmann::json;

namespace {

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A streamed request: the engine runs on its own thread so that the handler can wait for the
// first piece of text before committing to 200 (errors found while validating or queueing
// still get their 4xx), then hand the rest to httplib's chunked content provider.
struct StreamJob {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> pieces;  // text not yet written
  bool done = false;
  CompletionResult result;
  std::optional<RequestError> request_error;
  std::string failure;  // any other exception's message
  std::atomic<bool> client_gone{false};
  std::thread worker;  // never owns the job, so this destructor never runs on it

  ~StreamJob() {
    client_gone = true;
    if (worker.joinable()) worker.join();
  }

  void run(Engine& engine, const CompletionRequest& req) {
    worker = std::thread([this, &engine, req] {
      std::optional<RequestError> rerr;
      std::string fail;
      CompletionResult r;
      try {
        r = engine.complete(
            req,
            [this](std::string_view text) {
              if (client_gone) return false;
              if (!text.empty()) {
                std::lock_guard lk(mu);
                pieces.emplace_back(text);
              }
              cv.notify_all();
              return true;
            },
            [this] { return client_gone.load(); });
      } catch (const RequestError& e) {
        rerr = e;
      } catch (const std::exception& e) {
        fail = e.what();
      }
      std::lock_guard lk(mu);
      result = std::move(r);
      request_error = std::move(rerr);
      failure = std::move(fail);
      done = true;
      cv.notify_all();
    });
  }
};

}  // namespace

struct HttpServer::Impl {
  Engine& engine;
  HttpServerOptions opt;
  GuardedServer svr;
  AccessPolicy access;
  KeyIsolation isolation;
  KeyQuota chunk_quota;  // POST /v1/chunks texts in flight per key (issue 58 item 4)
  const InputBound input;
  KnowledgeService knowledge;  // the web page, its knowledge base and request details (issue 12)
  std::unique_ptr<PassageMatcher> matcher;  // --match-chunks (issue 27); null when off
  std::atomic<uint64_t> n2xx{0}, n4xx{0}, n5xx{0}, n_cancelled{0};
  const int64_t started = unix_seconds();

  Impl(Engine& e, HttpServerOptions o)
      : engine(e),
        opt(std::move(o)),
        svr(opt.connections),
        access(opt.access),
        isolation(opt.isolate_keys),
        chunk_quota(opt.max_key_chunk_texts > 0 ? opt.max_key_chunk_texts : e.options().max_chunk_texts),
        input(input_bound(e.tokenizer(), e.options().max_prompt_tokens)),
        knowledge(e, knowledge_options(opt), [this](const httplib::Request& req) { return access.matched_key(req); }) {
    if (opt.match_chunks) {
      PassageMatchOptions match;
      match.max_documents = e.options().max_documents;
      matcher = std::make_unique<PassageMatcher>(e.registry(), match);
    }
    if (isolation.enabled() && !access.keys_required())
      throw std::invalid_argument("--isolate-keys needs API keys (--api-key or --api-key-file)");
    setup();
  }

  static KnowledgeServiceOptions knowledge_options(const HttpServerOptions& o) {
    KnowledgeServiceOptions k;
    k.web_dir = o.web_dir;
    k.max_body_bytes = o.max_body_bytes;
    k.isolated = o.isolate_keys;
    k.kb.extract = o.extract;
    k.kb.max_pdf_jobs = o.pdf_jobs;
    k.kb.limits = o.knowledge;
    return k;
  }

  // The caller's tenant under --isolate-keys: its key's index (the pre-routing check has
  // already refused requests without a valid key).
  size_t tenant(const httplib::Request& req) const { return static_cast<size_t>(access.matched_key(req)); }

  // 128 random bits from OpenSSL's CSPRNG: an id names a request's details
  // (GET /v1/details/{id}), so it must not be guessable from another response's id (issue
  // 29, item 4; it was a per-process salt plus a counter).
  static std::string new_id(bool chat) {
    unsigned char bytes[16];
    if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("RAND_bytes failed (OpenSSL)");
    std::string id = chat ? "chatcmpl-" : "cmpl-";
    static constexpr char kHex[] = "0123456789abcdef";
    for (unsigned char b : bytes) {
      id += kHex[b >> 4];
      id += kHex[b & 15];
    }
    return id;
  }

  // A POST route with this server's body bound (route_wrappers.h).
  httplib::Server::HandlerWithContentReader guarded_post(PostRouteFn h) {
    return cf::guarded_post(opt.max_body_bytes, std::move(h));
  }

  using Req = httplib::Request;
  using Res = httplib::Response;
  using Handler = void (Impl::*)(const Req&, Res&);
  using BodyHandler = void (Impl::*)(const Req&, Res&, const std::string& body);

  // The route table. POST routes read a bounded body; GET and DELETE read none. Order is
  // httplib's match order: the API routes, then the knowledge base's (KnowledgeService), then a
  // 404 for any other POST or DELETE before its body is read, then the read-only routes.
  struct BodyRoute {
    const char* path;
    BodyHandler handler;
  };
  struct Route {
    const char* verb;  // GET or DELETE
    const char* path;
    Handler handler;
  };
  // (Functions, not static members: a member pointer needs the class complete.)
  static std::span<const BodyRoute> body_routes() {
    static constexpr BodyRoute kRoutes[] = {
      {"/v1/chat/completions", &Impl::chat_completion},
      {"/v1/completions", &Impl::text_completion},
      {"/v1/chunks", &Impl::post_chunks},
    };
    return kRoutes;
  }
  static std::span<const Route> chunk_routes() {
    static constexpr Route kRoutes[] = {
      {"GET", R"(/v1/chunks/([^/]+))", &Impl::get_chunk},
      {"DELETE", R"(/v1/chunks/([^/]+))", &Impl::delete_chunk},
    };
    return kRoutes;
  }
  static std::span<const Route> read_routes() {
    static constexpr Route kRoutes[] = {
      {"GET", "/v1/models", &Impl::list_models},
      {"GET", R"(/v1/models/(.+))", &Impl::get_model},
      {"GET", "/v1/methods", &Impl::list_methods},
      {"GET", "/health", &Impl::health},
      {"GET", "/metrics", &Impl::metrics},
      {"GET", "/v1/self_check", &Impl::self_check},
    };
    return kRoutes;
  }

  void add(const Route& r) {
    const auto h = [this, handler = r.handler](const Req& req, Res& res) { (this->*handler)(req, res); };
    if (std::string_view(r.verb) == "GET")
      svr.Get(r.path, guarded(h));
    else
      svr.Delete(r.path, guarded_no_body(h));
  }

  void setup() {
    svr.set_payload_max_length(opt.max_body_bytes);
    svr.set_tcp_nodelay(true);  // stream events are small; do not let Nagle hold them
    install_error_handlers();
    install_pre_routing();
    install_logger();
    for (const BodyRoute& r : body_routes())
      svr.Post(r.path, guarded_post([this, handler = r.handler](const Req& req, Res& res, const std::string& body) {
        (this->*handler)(req, res, body);
      }));
    for (const Route& r : chunk_routes()) add(r);
    knowledge.add_routes(svr);
    // Any other POST or DELETE: 404 before reading the body (registered last, matched last).
    const auto no_route = guarded_no_body([](const Req& req, Res&) {
      throw RequestError(404, "not_found_error", "no route for " + req.method + " " + req.path);
    });
    svr.Post(".*", no_route);
    svr.Delete(".*", no_route);
    for (const Route& r : read_routes()) add(r);
  }

  // Errors httplib itself produces (413, unknown route) get an OpenAI body too.
  void install_error_handlers() {
    svr.set_error_handler(httplib::Server::HandlerWithResponse([](const Req& req, Res& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string type = kInvalidRequestError, msg = "HTTP error " + std::to_string(res.status);
      if (res.status == 404) {
        type = "not_found_error";
        msg = "no route for " + req.method + " " + req.path;
      } else if (res.status == 413) {
        msg = "request body too large";
      } else if (res.status >= 500) {
        type = "server_error";
      }
      reply_json(res, res.status, api::error_body(res.status, type, msg));
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr.set_exception_handler([](const Req&, Res& res, std::exception_ptr) {
      reply_json(res, 500, api::error_body(500, "server_error", "internal error"));
    });
  }

  void install_pre_routing() {
    svr.set_pre_routing_handler([this](const Req& req, Res& res) {
      GuardedServer::headers_read();
      if (access.pre_route(req, res, !KnowledgeService::is_public_page(req)))
        return httplib::Server::HandlerResponse::Handled;
      // httplib reads the body of any other method (PUT, PATCH, PRI) into memory without a
      // bound before it finds no route: refuse those before a byte of body is read.
      static const std::set<std::string> kMethods{"GET", "HEAD", "POST", "DELETE", "OPTIONS"};
      if (!kMethods.count(req.method)) {
        GuardedServer::close_after_response();
        reply_json(res, 405, api::error_body(405, kInvalidRequestError, "method " + req.method + " not allowed"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
  }

  void install_logger() {
    svr.set_logger([this](const Req& req, const Res& res) {
      GuardedServer::response_done();
      if (res.status >= 500)
        ++n5xx;
      else if (res.status >= 400)
        ++n4xx;
      else
        ++n2xx;
      if (opt.log_requests)
        std::fprintf(stderr, "%s %s %s -> %d\n", req.remote_addr.c_str(), req.method.c_str(), req.path.c_str(),
                     res.status);
    });
  }

  void chat_completion(const Req& req, Res& res, const std::string& body) { completion(req, body, res, true); }
  void text_completion(const Req& req, Res& res, const std::string& body) { completion(req, body, res, false); }

  void post_chunks(const Req& req, Res& res, const std::string& body) {
    const auto texts = api::parse_chunk_texts(api::parse_body(body));
    check_chunk_texts_size(texts, input);
    // A list the engine refuses whole (413, --max-chunk-texts, never registrable) takes no quota:
    // a 429 "retry later" would be wrong for it.
    std::optional<KeyQuota::Hold> hold;
    if (texts.size() <= engine.options().max_chunk_texts)
      hold.emplace(chunk_quota.acquire(access.matched_key(req), texts.size()));
    json data = json::array();
    std::vector<std::string> ids;
    for (const auto& c : engine.register_chunks(texts, GuardedServer::client_gone)) {
      data.push_back(api::chunk_json(c, false));
      ids.push_back(c.id);
    }
    if (isolation.enabled()) isolation.note_registered(tenant(req), ids, texts);
    reply_json(res, 200, json{{"object", "list"}, {"data", data}});
  }

  static RequestError no_chunk(const std::string& id) {
    return RequestError(404, "not_found_error", "no chunk with id '" + id + "'", "id");
  }
  // 400 before the id names anything: "..x" reached outside the store (issue 29 item 8).
  static std::string chunk_id_of(const Req& req) {
    const std::string id = req.matches[1];
    if (!is_chunk_id(id))
      throw invalid_request("'" + printable_chunk_id(id) + "' is not a chunk id (32 lower-case hex digits)", "id");
    return id;
  }

  void get_chunk(const Req& req, Res& res) {
    const std::string id = chunk_id_of(req);
    if (isolation.enabled() && !isolation.owns(tenant(req), id)) throw no_chunk(id);
    auto c = engine.chunk(id);
    if (!c) throw no_chunk(id);
    reply_json(res, 200, api::chunk_json(*c, true));
  }

  void delete_chunk(const Req& req, Res& res) {
    const std::string id = chunk_id_of(req);
    bool deleted = true;
    if (isolation.enabled()) {
      bool was_owner = false;
      const bool last = isolation.release(tenant(req), id, was_owner);
      if (!was_owner) throw no_chunk(id);
      if (last) deleted = engine.remove_chunk(id);  // other keys that registered it keep it
    } else {
      deleted = engine.remove_chunk(id);
    }
    if (!deleted) throw no_chunk(id);
    reply_json(res, 200, json{{"id", id}, {"object", "chunk.deleted"}, {"deleted", true}});
  }

  void list_models(const Req&, Res& res) { reply_json(res, 200, api::models_json(engine.model_name(), started)); }

  void get_model(const Req& req, Res& res) {
    const json list = api::models_json(engine.model_name(), started);
    if (req.matches[1] != engine.model_name())
      throw RequestError(404, "not_found_error", "no model '" + std::string(req.matches[1]) + "'", "model");
    reply_json(res, 200, list["data"][0]);
  }

  void list_methods(const Req&, Res& res) {
    reply_json(res, 200, api::methods_json(engine.options().default_fusion));
  }

  void health(const Req&, Res& res) {
    const EngineMetrics m = engine.metrics();
    reply_json(res, 200,
               json{{"status", "ok"}, {"model", engine.model_name()}, {"queue_length", m.queue_length},
                    {"running", m.running}});
  }

  void metrics(const Req&, Res& res) {
    const EngineMetrics m = engine.metrics();
    const bool cache_use = !isolation.enabled();
    res.set_content(api::prometheus_text(m, counters_now(), cache_use) + self_check_prometheus(m.self_check) +
                        vllm_metrics_text(m, engine.model_name(), cache_use),
                    "text/plain; version=0.0.4");
  }

  // serve --self-check's ledger (serve/self_check.h): per plan, answers checked against full
  // prefill when idle, with Wilson intervals.
  void self_check(const Req&, Res& res) { reply_json(res, 200, self_check_json(engine.metrics().self_check)); }

  api::HttpCounters counters_now() const {
    const ConnectionCounters c = svr.counters();
    api::HttpCounters h{n2xx.load(), n4xx.load(), n5xx.load(), n_cancelled.load()};
    h.unauthorized = access.unauthorized();
    h.connections_refused = c.refused;
    h.connection_timeouts = c.timeouts + c.oversized_headers;
    h.connections_open = c.open;
    h.knowledge_failures = knowledge.knowledge_base().background_failures();
    h.chunk_texts_in_flight = chunk_quota.in_flight();
    h.chunk_posts_refused = chunk_quota.refused();
    return h;
  }

  // A completion request as the engine gets it: parsed, capped, retrieval and passage matching
  // applied, the caller's documents and conversation scoped to its key.
  struct PreparedCompletion {
    api::ParsedCompletion parsed;
    std::vector<RetrievedChunk> retrieved;
    int caller = -1;  // the matched API key; -1 without keys
    api::ResponseMeta meta;
  };

  PreparedCompletion prepare_completion(const Req& req, const std::string& body, bool chat) {
    PreparedCompletion p;
    const json body_json = api::parse_body(body);
    p.parsed = api::parse_completion(body_json, chat, engine.options().default_fusion);
    CompletionRequest& r = p.parsed.request;
    if (opt.max_completion_tokens > 0) r.max_tokens = std::min(r.max_tokens, opt.max_completion_tokens);
    p.retrieved = knowledge.apply_retrieval(body_json, r);
    check_input_size(r, input);
    // After the size check (it bounds the original text); a key matches its own chunks only.
    if (matcher) matcher->apply(r, isolation.enabled() ? &isolation : nullptr, tenant(req));
    p.caller = access.matched_key(req);
    if (isolation.enabled()) isolation.check_documents(tenant(req), r);
    // A conversation belongs to the key that started it: another key naming the same id gets
    // a conversation of its own and can neither continue nor wipe this one (issue 29, item 7).
    if (std::string& cid = r.fusion.conversation_id; !cid.empty() && p.caller >= 0)
      cid = "key" + std::to_string(p.caller) + ":" + cid;
    p.meta = {new_id(chat), unix_seconds(), r.model.empty() ? engine.model_name() : r.model, chat};
    return p;
  }

  void completion(const Req& req, const std::string& body, Res& res, bool chat) {
    PreparedCompletion p = prepare_completion(req, body, chat);
    if (p.parsed.stream) return stream_completion(std::move(p), res);
    const CompletionResult r = engine.complete(p.parsed.request, {}, GuardedServer::client_gone);
    json reply = api::completion_response(p.meta, r);
    knowledge.after_completion(p.meta.id, p.caller, p.parsed.request, r, p.retrieved, &reply);
    if (isolation.enabled()) KeyIsolation::redact(reply);
    reply_json(res, 200, reply);
  }

  // Server-sent events: the first text (or the request's error, as a plain error reply) before
  // the 200, then the pieces as the engine finalises them, then the finish and usage chunks.
  void stream_completion(PreparedCompletion p, Res& res) {
    auto job = std::make_shared<StreamJob>();
    job->run(engine, p.parsed.request);
    {
      // The connection's own thread waits out the prefill, watching its client: one that
      // leaves now cancels the request before its first token (issue 58 item 4).
      std::unique_lock lk(job->mu);
      while (!job->cv.wait_for(lk, std::chrono::milliseconds(Scheduler::kCancelPollMs),
                               [&] { return !job->pieces.empty() || job->done; }))
        if (GuardedServer::client_gone()) job->client_gone = true;
      if (job->done && job->pieces.empty()) {
        if (job->request_error) throw RequestError(*job->request_error);
        if (!job->failure.empty()) throw std::runtime_error(job->failure);
      }
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, p = std::make_shared<const PreparedCompletion>(std::move(p))](size_t, httplib::DataSink& sink) {
          return send_stream(*job, *p, sink);
        },
        [job](bool success) {
          if (!success) job->client_gone = true;
        });
  }

  // httplib's content provider: an exception escaping it would end the process (nothing
  // above it catches), so whatever fails after the 200 travels as the stream's error event.
  bool send_stream(StreamJob& job, const PreparedCompletion& p, httplib::DataSink& sink) {
    try {
      return send_stream_events(job, p, sink);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "chunkfuse serve: stream %s failed after its first event: %s\n", p.meta.id.c_str(), e.what());
      const std::string event = api::sse_event(api::error_body(500, "server_error", e.what()));
      if (sink.write(event.data(), event.size())) sink.done();
      return false;
    }
  }

  bool send_stream_events(StreamJob& job, const PreparedCompletion& p, httplib::DataSink& sink) {
    auto send = [&](const std::string& s) {
      if (sink.write(s.data(), s.size())) return true;
      job.client_gone = true;  // the engine frees the slot at its next step
      ++n_cancelled;
      return false;
    };
    if (!send(api::sse_event(api::stream_role_chunk(p.meta)))) return false;
    for (bool done = false; !done;) {
      std::vector<std::string> batch;
      {
        std::unique_lock lk(job.mu);
        job.cv.wait(lk, [&] { return !job.pieces.empty() || job.done; });
        batch.swap(job.pieces);
        done = job.done;
      }
      for (const auto& piece : batch)
        if (!send(api::sse_event(api::stream_text_chunk(p.meta, piece)))) return false;
    }
    // Past the 200 an error can only travel as an event (as OpenAI's API does).
    bool ok = true;
    if (job.request_error) {
      ok = send(api::sse_event(api::error_body(*job.request_error)));
    } else if (!job.failure.empty()) {
      ok = send(api::sse_event(api::error_body(500, "server_error", job.failure)));
    } else {
      knowledge.after_completion(p.meta.id, p.caller, p.parsed.request, job.result, p.retrieved, nullptr);
      json finish = api::stream_finish_chunk(p.meta, job.result);
      if (isolation.enabled()) KeyIsolation::redact(finish);
      ok = send(api::sse_event(finish));
      if (ok && p.parsed.include_usage) {
        json usage = api::stream_usage_chunk(p.meta, job.result);
        if (isolation.enabled()) KeyIsolation::redact(usage);
        ok = send(api::sse_event(usage));
      }
    }
    if (!ok || !send(api::kSseDone)) return false;
    sink.done();
    return true;
  }
};

HttpServer::HttpServer(Engine& engine, HttpServerOptions opt) : impl_(std::make_unique<Impl>(engine, std::move(opt))) {}
HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  auto& o = impl_->opt;
  if (o.port == 0) {
    const int port = impl_->svr.bind_to_any_port(o.host);
    if (port <= 0) throw std::runtime_error("cannot bind " + o.host + " to any port");
    o.port = port;
  } else if (!impl_->svr.bind_to_port(o.host, o.port)) {
    throw std::runtime_error("cannot bind " + o.host + ":" + std::to_string(o.port) + " (in use, or not a local address?)");
  }
  impl_->svr.widen_backlog();
  return o.port;
}

bool HttpServer::listen() { return impl_->svr.listen_after_bind(); }

void HttpServer::stop() {
  if (impl_->svr.is_running()) impl_->svr.stop();
}

api::HttpCounters HttpServer::counters() const { return impl_->counters_now(); }

}  // namespace cf

// HttpServer: cpp-httplib routes around Engine (see server.h). Each connection runs on one
// of httplib's pool threads, which blocks in Engine::complete while the engine schedules.
#include "serve/server.h"

#include "serve/key_isolation.h"
#include "serve/knowledge_routes.h"
#include "serve/passage_matching.h"
#include "serve/request_limits.h"
#include "serve/route_wrappers.h"

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
        r = engine.complete(req, [this](std::string_view text) {
          if (client_gone) return false;
          if (!text.empty()) {
            std::lock_guard lk(mu);
            pieces.emplace_back(text);
          }
          cv.notify_all();
          return true;
        });
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
        input(input_bound(e.tokenizer(), e.options().max_prompt_tokens)),
        knowledge(e, knowledge_options(opt), [this](const httplib::Request& req) { return access.matched_key(req); }) {
    if (opt.match_chunks) matcher = std::make_unique<PassageMatcher>(e, PassageMatchOptions{});
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

  void setup() {
    svr.set_payload_max_length(opt.max_body_bytes);
    svr.set_tcp_nodelay(true);  // stream events are small; do not let Nagle hold them

    // Errors httplib itself produces (413, unknown route) get an OpenAI body too.
    svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string type = "invalid_request_error", msg = "HTTP error " + std::to_string(res.status);
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
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
      reply_json(res, 500, api::error_body(500, "server_error", "internal error"));
    });
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      GuardedServer::headers_read();
      if (access.pre_route(req, res, !KnowledgeService::is_public_page(req)))
        return httplib::Server::HandlerResponse::Handled;
      // httplib reads the body of any other method (PUT, PATCH, PRI) into memory without a
      // bound before it finds no route: refuse those before a byte of body is read.
      static const std::set<std::string> kMethods{"GET", "HEAD", "POST", "DELETE", "OPTIONS"};
      if (!kMethods.count(req.method)) {
        GuardedServer::close_after_response();
        reply_json(res, 405, api::error_body(405, "invalid_request_error", "method " + req.method + " not allowed"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
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

    svr.Post("/v1/chat/completions", guarded_post([this](const auto& req, auto& res, const std::string& body) {
      completion(req, body, res, true);
    }));
    svr.Post("/v1/completions", guarded_post([this](const auto& req, auto& res, const std::string& body) {
      completion(req, body, res, false);
    }));

    svr.Post("/v1/chunks", guarded_post([this](const httplib::Request& req, httplib::Response& res, const std::string& body) {
      const auto texts = api::parse_chunk_texts(api::parse_body(body));
      check_chunk_texts_size(texts, input);
      json data = json::array();
      std::vector<std::string> ids;
      for (const auto& c : engine.register_chunks(texts)) {
        data.push_back(api::chunk_json(c, false));
        ids.push_back(c.id);
      }
      if (isolation.enabled()) isolation.note_registered(tenant(req), ids);
      reply_json(res, 200, json{{"object", "list"}, {"data", data}});
    }));
    auto no_chunk = [](const std::string& id) {
      return RequestError(404, "not_found_error", "no chunk with id '" + id + "'", "id");
    };
    // 400 before the id names anything: "..x" reached outside the store (issue 29 item 8).
    auto chunk_id_of = [](const httplib::Request& req) {
      const std::string id = req.matches[1];
      if (!is_chunk_id(id))
        throw RequestError(400, "invalid_request_error",
                           "'" + printable_chunk_id(id) + "' is not a chunk id (32 lower-case hex digits)", "id");
      return id;
    };
    svr.Get(R"(/v1/chunks/([^/]+))", guarded([this, no_chunk, chunk_id_of](const httplib::Request& req,
                                                                           httplib::Response& res) {
      const std::string id = chunk_id_of(req);
      if (isolation.enabled() && !isolation.owns(tenant(req), id)) throw no_chunk(id);
      auto c = engine.chunk(id);
      if (!c) throw no_chunk(id);
      reply_json(res, 200, api::chunk_json(*c, true));
    }));
    svr.Delete(R"(/v1/chunks/([^/]+))", guarded_no_body([this, no_chunk, chunk_id_of](const httplib::Request& req,
                                                                                      httplib::Response& res) {
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
    }));
    knowledge.add_routes(svr);
    // Any other POST or DELETE: 404 before reading the body (registered last, matched last).
    const auto no_route = guarded_no_body([](const httplib::Request& req, httplib::Response&) {
      throw RequestError(404, "not_found_error", "no route for " + req.method + " " + req.path);
    });
    svr.Post(".*", no_route);
    svr.Delete(".*", no_route);

    svr.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
      reply_json(res, 200, api::models_json(engine.model_name(), started));
    }));
    svr.Get(R"(/v1/models/(.+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
      const json list = api::models_json(engine.model_name(), started);
      if (req.matches[1] != engine.model_name())
        throw RequestError(404, "not_found_error", "no model '" + std::string(req.matches[1]) + "'", "model");
      reply_json(res, 200, list["data"][0]);
    }));
    svr.Get("/v1/methods", guarded([this](const httplib::Request&, httplib::Response& res) {
      reply_json(res, 200, api::methods_json(engine.options().default_method));
    }));
    svr.Get("/health", guarded([this](const httplib::Request&, httplib::Response& res) {
      const EngineMetrics m = engine.metrics();
      reply_json(res, 200,
                 json{{"status", "ok"}, {"model", engine.model_name()}, {"queue_length", m.queue_length},
                      {"running", m.running}});
    }));
    svr.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
      res.set_content(api::prometheus_text(engine.metrics(), counters_now(), !isolation.enabled()),
                      "text/plain; version=0.0.4");
    }));
  }

  api::HttpCounters counters_now() const {
    const ConnectionCounters c = svr.counters();
    api::HttpCounters h{n2xx.load(), n4xx.load(), n5xx.load(), n_cancelled.load()};
    h.unauthorized = access.unauthorized();
    h.connections_refused = c.refused;
    h.connection_timeouts = c.timeouts + c.oversized_headers;
    h.connections_open = c.open;
    h.knowledge_failures = knowledge.knowledge_base().background_failures();
    return h;
  }

  void completion(const httplib::Request& req, const std::string& body, httplib::Response& res, bool chat) {
    const json body_json = api::parse_body(body);
    api::ParsedCompletion pc =
        api::parse_completion(body_json, chat, engine.options().default_method, engine.options().default_ratio);
    if (opt.max_completion_tokens > 0) pc.request.max_tokens = std::min(pc.request.max_tokens, opt.max_completion_tokens);
    const auto retrieved = knowledge.apply_retrieval(body_json, pc.request);
    check_input_size(pc.request, input);
    if (matcher) matcher->apply(pc.request);  // after the size check: it bounds the original text
    const bool isolated = isolation.enabled();
    const int caller = access.matched_key(req);  // -1 without keys
    if (isolated) isolation.check_documents(tenant(req), pc.request);
    // A conversation belongs to the key that started it: another key naming the same id gets
    // a conversation of its own and can neither continue nor wipe this one (issue 29, item 7).
    if (std::string& cid = pc.request.fusion.conversation_id; !cid.empty() && caller >= 0)
      cid = "key" + std::to_string(caller) + ":" + cid;
    api::ResponseMeta meta{new_id(chat), unix_seconds(),
                           pc.request.model.empty() ? engine.model_name() : pc.request.model, chat};
    if (!pc.stream) {
      const CompletionResult r = engine.complete(pc.request);
      json reply = api::completion_response(meta, r);
      knowledge.after_completion(meta.id, caller, pc.request, r, retrieved, &reply);
      if (isolated) KeyIsolation::redact(reply);
      reply_json(res, 200, reply);
      return;
    }

    auto job = std::make_shared<StreamJob>();
    job->run(engine, pc.request);
    {
      std::unique_lock lk(job->mu);
      job->cv.wait(lk, [&] { return !job->pieces.empty() || job->done; });
      if (job->done && job->pieces.empty()) {
        if (job->request_error) throw RequestError(*job->request_error);
        if (!job->failure.empty()) throw std::runtime_error(job->failure);
      }
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, meta, isolated, include_usage = pc.include_usage, req = pc.request, retrieved, caller](
            size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& s) {
            if (sink.write(s.data(), s.size())) return true;
            job->client_gone = true;  // the engine frees the slot at its next step
            ++n_cancelled;
            return false;
          };
          if (!send(api::sse_event(api::stream_role_chunk(meta)))) return false;
          for (;;) {
            std::vector<std::string> batch;
            bool done = false;
            {
              std::unique_lock lk(job->mu);
              job->cv.wait(lk, [&] { return !job->pieces.empty() || job->done; });
              batch.swap(job->pieces);
              done = job->done;
            }
            for (const auto& piece : batch)
              if (!send(api::sse_event(api::stream_text_chunk(meta, piece)))) return false;
            if (done) break;
          }
          // Past the 200 an error can only travel as an event (as OpenAI's API does).
          bool ok = true;
          if (job->request_error)
            ok = send(api::sse_event(api::error_body(*job->request_error)));
          else if (!job->failure.empty())
            ok = send(api::sse_event(api::error_body(500, "server_error", job->failure)));
          else {
            knowledge.after_completion(meta.id, caller, req, job->result, retrieved, nullptr);
            ok = send(api::sse_event(api::stream_finish_chunk(meta, job->result.finish_reason)));
            if (ok && include_usage) {
              json usage = api::stream_usage_chunk(meta, job->result);
              if (isolated) KeyIsolation::redact(usage);
              ok = send(api::sse_event(usage));
            }
          }
          if (!ok || !send(api::kSseDone)) return false;
          sink.done();
          return true;
        },
        [job](bool success) {
          if (!success) job->client_gone = true;
        });
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

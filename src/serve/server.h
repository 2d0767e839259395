// The HTTP layer of `chunkfuse serve` (issue 5, item 1): OpenAI-compatible completions and
// chat completions (with server-sent-event streaming), the RAG extensions (`documents`,
// `fusion`), chunk registration, health and Prometheus metrics, over cpp-httplib. All model
// work happens in Engine; this layer only parses, validates and formats.
//
// The pure request/response translation (cf::api) is in api_json.h, testable without a socket
// or a model; HttpServer wires it to httplib.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/api_json.h"
#include "serve/document_text.h"
#include "serve/http_access.h"
#include "serve/http_guard.h"
#include "serve/knowledge_base_file.h"

namespace cf {

class Engine;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                               // 0: any free port (see HttpServer::bind)
  ConnectionLimits connections;                  // cap, request deadline, keep-alive (http_guard.h)
  size_t max_body_bytes = size_t{8} << 20;       // larger bodies get 413, in any transfer encoding
  AccessOptions access;                          // API keys, CORS (http_access.h)
  bool isolate_keys = false;                     // per-key chunk isolation (key_isolation.h); needs keys
  size_t max_key_chunk_texts = 0;                // chunk texts a key may have registering at once (key_quota.h);
                                                 // 0: the engine's max_chunk_texts
  int max_completion_tokens = 0;                 // a request's max_tokens is lowered to this; 0: no cap
  bool log_requests = false;                     // one line per request on stderr
  std::string web_dir;                           // the built page; empty: find_web_dir() (knowledge_routes.h)
  bool match_chunks = false;                     // find passages in plain messages (passage_matching.h)
  ExtractOptions extract;                        // uploads: PDF reader limits (document_text.h)
  size_t pdf_jobs = 2;                           // pdftotext processes at once (knowledge_base.h)
  KnowledgeBaseLimits knowledge;                 // documents, chunks, text bytes (knowledge_base_file.h)
};

class HttpServer {
 public:
  HttpServer(Engine& engine, HttpServerOptions opt);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port (the chosen one when opt.port is 0).
  // Throws std::runtime_error when the address cannot be bound.
  int bind();
  // Serves until stop(); returns false if the listener failed.
  bool listen();
  // Thread-safe; in-flight requests finish, then listen() returns.
  void stop();

  api::HttpCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cf

// The web app's side of `chunkfuse serve` (issue 12): the knowledge-base endpoints, retrieval
// inside chat requests, per-request details, and the page itself as static files.
//
//   POST   /v1/documents                    {name, text | content_base64, chunk_tokens?} -> 202 document
//   GET    /v1/documents                    list with precompute progress
//   GET    /v1/documents/{id}               one document, its chunks and their text
//   DELETE /v1/documents/{id}
//   GET    /v1/knowledge/chunks             every chunk (source, tokens, summary, hash, cache, uses)
//   DELETE /v1/knowledge/chunks/{id}
//   POST   /v1/retrieve                     {query, k?} -> top-k chunks with BM25 scores
//   GET    /v1/details/{response id}        what a completion's prefill did (recent ones only, same key only)
//   GET    /  and  /ui/...                  the page (web/dist), without an API key
//
// A chat or completion request may carry "retrieval": {"k": 3} (and optionally "query")
// instead of "documents": the top-k chunks of the knowledge base become its documents.
//
// Under --isolate-keys the knowledge base is one shared collection, so its endpoints and the
// retrieval field answer 403 there (deviation: no per-key knowledge bases).
#pragma once
#include <httplib.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/knowledge_base.h"

namespace cf {

struct KnowledgeServiceOptions {
  std::string web_dir;             // the built page (index.html, assets/); empty: find_web_dir()
  size_t max_body_bytes = 8 << 20;
  bool isolated = false;           // --isolate-keys
  size_t kept_details = 64;        // GET /v1/details keeps the last this many requests
  size_t kept_details_bytes = size_t{32} << 20;  // and at most this much of their JSON (issue 59)
  KnowledgeBaseOptions kb;
};

// The first folder holding index.html among: $CHUNKFUSE_WEB_DIR, <exe dir>/web,
// <exe dir>/../web/dist, <exe dir>/../share/chunkfuse/web, the source tree's web/dist. "" if none.
std::string find_web_dir();

// The per-request detail the page shows (recomputed positions per chunk, selector scores,
// timings, token pieces), from a completion's result.
nlohmann::json request_detail_json(const std::string& id, const CompletionRequest& req, const CompletionResult& r,
                                   const std::vector<RetrievedChunk>& retrieved, const Tokenizer& tok);

class KnowledgeService {
 public:
  // The API key a request carries, as an index (AccessPolicy::matched_key); -1: none.
  using CallerOf = std::function<int(const httplib::Request&)>;
  KnowledgeService(Engine& engine, KnowledgeServiceOptions opt, CallerOf caller_of);

  // Registers the routes (before any catch-all route).
  void add_routes(httplib::Server& svr);
  // True for the page's own GETs, which need no API key (they hold no data).
  static bool is_public_page(const httplib::Request& req);

  // A completion body's "retrieval" field: fills req.documents from the knowledge base and
  // returns the chunks used (empty without the field). Throws RequestError 400/403.
  std::vector<RetrievedChunk> apply_retrieval(const nlohmann::json& body, CompletionRequest& req);
  // After a completion: counts the uses, keeps the detail for GET /v1/details/{id} (readable
  // by the same key only, `caller`), and adds "retrieval" to the response's "chunkfuse"
  // object when given one.
  void after_completion(const std::string& id, int caller, const CompletionRequest& req, const CompletionResult& r,
                        const std::vector<RetrievedChunk>& retrieved, nlohmann::json* response);

  // The detail after_completion kept for request `id` of `caller`; nullopt when unknown,
  // another key's, or no longer kept.
  std::optional<nlohmann::json> detail(const std::string& id, int caller) const;
  KnowledgeBase& knowledge_base() { return kb_; }
  const KnowledgeBase& knowledge_base() const { return kb_; }

 private:
  void serve_page(const httplib::Request& req, httplib::Response& res) const;
  void check_shared() const;

  KnowledgeServiceOptions opt_;
  KnowledgeBase kb_;
  mutable std::mutex mu_;
  CallerOf caller_of_;
  struct Detail {
    std::string id;  // the response id: 128 random bits
    int caller;      // the key that made the request (-1: no keys); only it may read the detail
    nlohmann::json detail;
    size_t bytes;    // its JSON's length
  };
  std::deque<Detail> details_;  // oldest first
  size_t details_bytes_ = 0;
};

}  // namespace cf

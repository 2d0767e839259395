// Who may call `chunkfuse serve` (issue 17, item 3): API keys the way OpenAI-compatible
// servers (OpenAI, vLLM, llama.cpp's server) take them, a CORS policy and JSON-only POSTs.
//
//  - Keys: `Authorization: Bearer <key>` on every route except GET /health (load balancers
//    probe it) and CORS preflights (browsers send no credentials on them); GET /metrics too
//    unless metrics_public. The token is compared with every key in constant time (SHA-256
//    of both, CRYPTO_memcmp, no early exit over keys), so neither a key's bytes nor its
//    length leak through timing. A missing or wrong key gets 401 with OpenAI's error body
//    (code "invalid_api_key") and `WWW-Authenticate: Bearer`. No keys configured: open, as
//    before.
//  - CORS: off by default (no Access-Control-* header at all, so a page of another origin
//    cannot read any answer). Listed origins (or "*") get Access-Control-Allow-Origin on
//    every response and an answered preflight (OPTIONS, 204).
//  - JSON-only POSTs: a POST whose Content-Type is not application/json gets 415 before its
//    body is read. This shuts out the browser "simple request" (text/plain, form posts) that
//    any web page can send without a preflight.
//  - Host check (issue 29, item 3), when no keys are configured: a page whose domain rebinds
//    to 127.0.0.1 is same-origin with the server, so its requests carry that domain in Host.
//    Accepted: an IP address (v4, or v6 in brackets; no DNS name, so nothing to rebind),
//    "localhost" and its subdomains (RFC 6761: they resolve to loopback), the names given by
//    --allowed-host (`*` allows any), and HTTP/1.0 requests without Host (no browser sends
//    those). Anything else gets 403 (code "host_not_allowed") before routing, on every route.
//    With keys the check is off: a rebinding page holds no key.
#pragma once
#include <httplib.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cf {

struct AccessOptions {
  std::vector<std::string> api_keys;      // empty: no authentication
  bool metrics_public = false;            // GET /metrics without a key
  std::vector<std::string> cors_origins;  // "https://app.example", or "*"; empty: no CORS
  std::vector<std::string> allowed_hosts; // extra Host names accepted without keys; "*": any
};

// True when `host` (a Host header value, port included or not) may reach a server without
// keys: an IP literal, localhost, or one of `allowed` (case-insensitive; "*" allows all).
bool host_allowed(std::string_view host, const std::vector<std::string>& allowed);

// Keys from a file: one per line; blank lines and lines starting with '#' are skipped,
// surrounding whitespace trimmed. Throws std::runtime_error if the file cannot be read or
// holds no key.
std::vector<std::string> read_api_key_file(const std::string& path);

class AccessPolicy {
 public:
  explicit AccessPolicy(AccessOptions opt);  // throws std::invalid_argument on an empty key

  // httplib's pre-routing hook: checks the Host (no keys), adds CORS headers, answers
  // preflights, checks the key. Returns true when the request has been answered here
  // (403, preflight or 401). `needs_key` false: a route open without a key (the page).
  bool pre_route(const httplib::Request& req, httplib::Response& res, bool needs_key);
  // The same, for a route that needs a key.
  bool pre_route(const httplib::Request& req, httplib::Response& res) { return pre_route(req, res, true); }

  bool keys_required() const { return !digests_.empty(); }
  // The index of the key the request's bearer token matches (keys in the order given:
  // --api-key flags, then each --api-key-file's lines); -1 when none does.
  int matched_key(const httplib::Request& req) const;
  uint64_t unauthorized() const { return unauthorized_.load(); }

 private:
  using Digest = std::array<unsigned char, 32>;
  int key_index(std::string_view token) const;  // -1: no key
  bool origin_allowed(const std::string& origin) const;

  AccessOptions opt_;
  std::vector<Digest> digests_;
  std::atomic<uint64_t> unauthorized_{0};
};

// Throws RequestError 415 unless the request's Content-Type is application/json (any
// parameters, e.g. charset, allowed); marks the connection to close (its body is unread).
void require_json_content(const httplib::Request& req);

}  // namespace cf
